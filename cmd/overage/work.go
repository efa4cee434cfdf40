package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/workers"
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
	logger := newLogger(e.stderr, cfg.LogLevel)
	pool, err := openPool(ctx, cfg.DatabaseURL, workMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	w, err := newWorkers(pool, cfg, logger)
	if err != nil {
		return err
	}
	logger.Info("working", "stripe_api_base", cfg.StripeAPIBase, "report_workers", cfg.ReportWorkers)
	return w.Run(ctx)
}

// newWorkers builds the Stripe client and the River workers on pool.
func newWorkers(pool *pgxpool.Pool, cfg *Config, logger *slog.Logger) (*workers.Workers, error) {
	sc, err := stripeclient.New(stripeclient.Config{
		SecretKey: cfg.StripeSecretKey,
		APIBase:   cfg.StripeAPIBase,
		RateLimit: cfg.StripeRateLimit,
		Logger:    logger,
	})
	if err != nil {
		return nil, fmt.Errorf("STRIPE_SECRET_KEY/STRIPE_API_BASE: %w", err)
	}
	w, err := workers.New(pool, workers.Config{
		Logger:            logger,
		Stripe:            sc,
		MeterInputEvent:   cfg.MeterInputEvent,
		MeterOutputEvent:  cfg.MeterOutputEvent,
		IdempotencyWindow: cfg.StripeIdempotencyWindow,
		SweepInterval:     cfg.SweepInterval,
		SweepGrace:        cfg.SweepGrace,
		MaxAttempts:       cfg.ReportMaxAttempts,
		ReportWorkers:     cfg.ReportWorkers,
		JobTimeout:        cfg.ReportJobTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	return w, nil
}
