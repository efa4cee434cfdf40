package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/overage-billing/overage/api"
	"github.com/overage-billing/overage/metrics"

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
	reg := newRegistry(pool, logger)
	w, err := newWorkers(pool, cfg, logger, reg)
	if err != nil {
		return err
	}
	if cfg.WorkListenAddr != "" {
		stop, err := serveWorkHealth(ctx, cfg.WorkListenAddr, pool, reg, logger)
		if err != nil {
			return err
		}
		defer stop()
	}
	logger.Info("working", "stripe_api_base", cfg.StripeAPIBase, "report_workers", cfg.ReportWorkers)
	return w.Run(ctx)
}

// serveWorkHealth serves /healthz, /readyz and /metrics of a work process.
func serveWorkHealth(ctx context.Context, addr string, pool *pgxpool.Pool, reg *prometheus.Registry, logger *slog.Logger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("WORK_LISTEN_ADDR=%s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           api.NewRouter(api.Config{DB: pool, Logger: logger, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	logger.Info("work health and metrics", "addr", ln.Addr().String())
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}

// newWorkers builds the Stripe client and the River workers on pool.
func newWorkers(pool *pgxpool.Pool, cfg *Config, logger *slog.Logger, reg prometheus.Registerer) (*workers.Workers, error) {
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
		Stripe:            metrics.InstrumentSender(sc, reg),
		MeterInputEvent:   cfg.MeterInputEvent,
		MeterOutputEvent:  cfg.MeterOutputEvent,
		IdempotencyWindow: cfg.StripeIdempotencyWindow,
		SweepInterval:     cfg.SweepInterval,
		SweepGrace:        cfg.SweepGrace,
		MaxAttempts:       cfg.ReportMaxAttempts,
		ReportWorkers:     cfg.ReportWorkers,
		JobTimeout:        cfg.ReportJobTimeout,
		BatchDelay:        cfg.ReportBatchDelay,
		BatchMax:          cfg.ReportBatchMax,
		StreamIdleTimeout: cfg.StreamIdleTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	return w, nil
}
