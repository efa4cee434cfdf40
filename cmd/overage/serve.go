package main

import (
	"context"

	"github.com/overage-billing/overage/app"
)

func cmdServe(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "serve", "overage serve [--listen ADDR] [--database-url URL]")
	fs.setting("listen", "LISTEN_ADDR", "address to listen on (LISTEN_ADDR)")
	var cfg app.ServeConfig
	if err := loadConfig(e, fs, args, &cfg); err != nil {
		return err
	}
	logger := app.NewLogger(e.stderr, cfg.Log.Level)
	srv, err := app.NewServer(ctx, &cfg, logger)
	if err != nil {
		return err
	}
	defer srv.Close()
	logger.Info("serving", "addr", srv.Addr())
	return srv.Run(ctx)
}
