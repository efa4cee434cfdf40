package main

import (
	"context"

	"github.com/overage-billing/overage/app"
)

func cmdServe(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "serve", "overage serve [--listen ADDR] [--database-url URL]")
	var listen string
	fs.StringVar(&listen, "listen", "", "address to listen on (LISTEN_ADDR)")
	cfg, err := loadConfig(e, fs, args)
	if err != nil {
		return err
	}
	if listen != "" {
		cfg.ListenAddr = listen
	}
	logger := app.NewLogger(e.stderr, cfg.LogLevel)
	srv, err := app.NewServer(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer srv.Close()
	logger.Info("serving", "addr", srv.Addr())
	return srv.Run(ctx)
}
