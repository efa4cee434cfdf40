package app

import (
	"context"
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

// ServeWorkHealth serves /healthz, /readyz and /metrics of a work process
// until the returned stop is called.
func ServeWorkHealth(ctx context.Context, addr string, pool *pgxpool.Pool, reg *prometheus.Registry, logger *slog.Logger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("WORK_LISTEN_ADDR=%s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           api.NewRouter(api.Config{DB: pool, Logger: logger, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}),
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
	}
	go func() { _ = srv.Serve(ln) }()
	logger.Info("work health and metrics", "addr", ln.Addr().String())
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}

// NewWorkers builds the Stripe client and the River workers on pool; the
// Stripe calls are counted in reg.
func NewWorkers(pool *pgxpool.Pool, cfg *Config, logger *slog.Logger, reg prometheus.Registerer) (*workers.Workers, error) {
	sc, err := stripeclient.New(stripeclient.Config{
		SecretKey: cfg.StripeSecretKey,
		APIBase:   cfg.StripeAPIBase,
		RateLimit: cfg.StripeRateLimit,
		Logger:    logger,
	})
	if err != nil {
		return nil, fmt.Errorf("STRIPE_SECRET_KEY/STRIPE_API_BASE: %w", err)
	}
	w, err := workers.New(pool, WorkersConfig(cfg, logger, metrics.InstrumentSender(sc, reg)))
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	return w, nil
}

// WorkersConfig is cfg as the workers take it, reporting through stripe.
func WorkersConfig(cfg *Config, logger *slog.Logger, stripe stripeclient.Sender) workers.Config {
	return workers.Config{
		Logger:            logger,
		Stripe:            stripe,
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
		PeriodCloseGrace:  cfg.PeriodCloseGrace,
	}
}
