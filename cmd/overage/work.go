package main

import (
	"context"
	"errors"

	"github.com/overage-billing/overage/app"
)

const workSynopsis = `overage work [--database-url URL]

Runs the River workers that report overage to Stripe, and the periodic sweep.
Requires STRIPE_SECRET_KEY (sk_test_... with STRIPE_API_BASE pointing at a Stripe
emulator or stripe-mock to try it out) and a migrated DATABASE_URL. Also reads
STRIPE_API_BASE, STRIPE_METER_INPUT_EVENT, STRIPE_METER_OUTPUT_EVENT,
STRIPE_RATE_LIMIT, STRIPE_IDEMPOTENCY_WINDOW, REPORT_MAX_ATTEMPTS,
REPORT_BATCH_DELAY, REPORT_BATCH_MAX, REPORT_WORKERS, REPORT_JOB_TIMEOUT,
SWEEP_INTERVAL, SWEEP_GRACE, STREAM_IDLE_TIMEOUT, WORK_LISTEN_ADDR (health
and metrics), LOG_LEVEL.`

func cmdWork(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "work", workSynopsis)
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
	if err := app.CheckSchema(ctx, pool); err != nil {
		return err
	}
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
