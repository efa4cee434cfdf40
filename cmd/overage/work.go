package main

import (
	"context"
	"errors"

	"github.com/overage-billing/overage/app"
)

func cmdWork(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "work", "overage work [--database-url URL]")
	cfg, err := loadConfig(e, fs, args)
	if err != nil {
		return err
	}
	if cfg.StripeSecretKey == "" {
		return errors.New("STRIPE_SECRET_KEY is required by overage work (use sk_test_... with STRIPE_API_BASE pointing at an emulator or stripe-mock to try it out)")
	}
	logger := app.NewLogger(e.stderr, cfg.LogLevel)
	pool, err := app.OpenPool(ctx, cfg.DatabaseURL, app.WorkMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	app.WarnConnectionBudget(ctx, pool, int(pool.Config().MaxConns), logger)
	reg := app.NewRegistry(pool, logger)
	w, err := app.NewWorkers(pool, cfg, logger, reg)
	if err != nil {
		return err
	}
	if cfg.WorkListenAddr != "" {
		stop, err := app.ServeWorkHealth(ctx, cfg.WorkListenAddr, pool, reg, logger)
		if err != nil {
			return err
		}
		defer stop()
	}
	logger.Info("working", "stripe_api_base", cfg.StripeAPIBase, "report_workers", cfg.ReportWorkers)
	return w.Run(ctx)
}
