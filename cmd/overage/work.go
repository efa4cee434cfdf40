package main

import (
	"context"

	"github.com/overage-billing/overage/app"
)

const workSynopsis = `overage work [--database-url URL]

Runs the River workers that report overage to Stripe, and the periodic sweep.
Requires STRIPE_SECRET_KEY (sk_test_... with STRIPE_API_BASE pointing at a Stripe
emulator or stripe-mock to try it out) and a migrated DATABASE_URL; serves health
and metrics on WORK_LISTEN_ADDR if set.`

func cmdWork(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "work", workSynopsis)
	var cfg app.WorkConfig
	if err := loadConfig(e, fs, args, &cfg); err != nil {
		return err
	}
	logger := app.NewLogger(e.stderr, cfg.Log.Level)
	w, err := app.NewWorker(ctx, &cfg, logger)
	if err != nil {
		return err
	}
	defer w.Close()
	logger.Info("working", "stripe_api_base", cfg.Stripe.APIBase, "report_workers", cfg.Workers)
	return w.Run(ctx)
}
