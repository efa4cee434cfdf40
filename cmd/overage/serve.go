package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"riverqueue.com/riverui"

	"github.com/overage-billing/overage/api"
	"github.com/overage-billing/overage/finance"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/metrics"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/webhooks"
)

// shutdownTimeout bounds how long in-flight requests may take to finish
// after SIGTERM.
const shutdownTimeout = 25 * time.Second

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
	logger := newLogger(e.stderr, cfg.LogLevel)
	srv, err := NewServer(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer srv.Close()
	logger.Info("serving", "addr", srv.Addr())
	return srv.Run(ctx)
}

// Server is `overage serve`: the HTTP API on one listener. Tests start it
// on 127.0.0.1:0 and read Addr.
type Server struct {
	pool     *pgxpool.Pool
	ownsPool bool
	riverUI  *riverui.Handler
	ln       net.Listener
	http     *http.Server
	logger   *slog.Logger
}

// NewServer connects, listens and wires the API; Run serves it.
func NewServer(ctx context.Context, cfg *Config, logger *slog.Logger) (*Server, error) {
	pool, err := openPool(ctx, cfg.DatabaseURL, serveMaxConns)
	if err != nil {
		return nil, err
	}
	s, err := newServer(pool, cfg, logger)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownsPool = true
	return s, nil
}

// newServer wires the API on a pool the caller owns.
func newServer(pool *pgxpool.Pool, cfg *Config, logger *slog.Logger) (*Server, error) {
	// Insert-only: `serve` runs no workers, it only puts jobs in the
	// outbox inside its transactions.
	rc, err := river.NewClient[pgx.Tx](riverpgxv5.New(pool), &river.Config{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("LISTEN_ADDR=%s: %w", cfg.ListenAddr, err)
	}
	reg := newRegistry(pool, logger)
	ui, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(rc, nil), Logger: logger, Prefix: "/riverui",
	})
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("river ui: %w", err)
	}
	svc := ingest.NewService(pool, outbox.NewInserter(rc, cfg.ReportMaxAttempts).WithBatchDelay(cfg.ReportBatchDelay))
	handler := api.NewRouter(api.Config{
		DB:     pool,
		Logger: logger,
		Handlers: []api.Mounter{
			ingest.NewHandler(ingest.HandlerConfig{
				Service: svc, Auth: tenants.NewStore(pool), AdminToken: cfg.AdminToken, Logger: logger,
				Observer: metrics.NewIngest(reg),
			}),
			finance.NewHandler(finance.HandlerConfig{DB: pool, AdminToken: cfg.AdminToken, Logger: logger}),
			webhooks.NewHandler(webhooks.HandlerConfig{Pool: pool, River: rc, Secret: cfg.StripeWebhookSecret, Logger: logger}),
		},
		Metrics:    promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		RiverUI:    ui,
		AdminToken: cfg.AdminToken,
	})
	return &Server{
		pool: pool, ln: ln, logger: logger, riverUI: ui,
		http: &http.Server{
			Handler:           handler,
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			// Requests keep running after ctx is done so a shutdown lets them
			// finish instead of rolling back half the in-flight work.
			BaseContext: func(net.Listener) context.Context { return context.Background() },
		},
	}, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Run serves until ctx is done, then stops taking requests and lets the
// in-flight ones finish.
func (s *Server) Run(ctx context.Context) error {
	if err := s.riverUI.Start(ctx); err != nil {
		return fmt.Errorf("start river ui: %w", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- s.http.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	s.logger.Info("shutting down: finishing in-flight requests")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := s.http.Shutdown(sctx); err != nil {
		return fmt.Errorf("http shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close releases the database pool, if the server opened it.
func (s *Server) Close() {
	if s.ownsPool {
		s.pool.Close()
	}
}

// newRegistry returns a Prometheus registry with the process metrics and
// the billing backlog read from pool at scrape time.
func newRegistry(pool *pgxpool.Pool, logger *slog.Logger) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics.RegisterBacklog(reg, func(ctx context.Context) (metrics.Backlog, error) { return metrics.ReadBacklog(ctx, pool) }, logger)
	return reg
}
