package app

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

	"github.com/overage-billing/overage/alerts"
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

// Worker is `overage work`: the River workers, the sweep and, on
// WORK_LISTEN_ADDR, health and metrics. Run runs it; Close releases what
// NewWorker opened.
type Worker struct {
	// Pool is the pool of the workers' own statements.
	Pool *pgxpool.Pool
	// RiverPool is River's (workers.Config.RiverPool) and MaintenancePool
	// the maintenance queue's (workers.Config.MaintenancePool); nil when
	// they run on Pool (NewWorkerOn).
	RiverPool, MaintenancePool *pgxpool.Pool
	// Workers are the River workers and periodic jobs.
	Workers *workers.Workers
	// Registry is the one the health listener's /metrics serves.
	Registry   *prometheus.Registry
	ownsPool   bool
	stopHealth func()
	claim      *BatchDelayClaim
}

// NewWorker connects, checks the schema is migrated (CheckSchema), claims
// its REPORT_BATCH_DELAY (logging an error when a live serve or work runs
// with another), listens on WORK_LISTEN_ADDR if set and wires the
// workers. It needs STRIPE_SECRET_KEY. It opens three pools: the workers'
// (WorkPoolMaxConns), the maintenance queue's (MaintenancePoolMaxConns)
// and River's own (RiverPoolMaxConns), so that billing holding every
// connection of the first can neither stop River fetching, completing
// and electing the leader that enqueues the periodic jobs, nor delay
// those jobs once fetched (the partitions ingest needs ahead among them).
func NewWorker(ctx context.Context, cfg *WorkConfig, logger *slog.Logger) (_ *Worker, err error) {
	if cfg.Stripe.SecretKey == "" {
		return nil, errors.New("STRIPE_SECRET_KEY is required by overage work (use sk_test_... with STRIPE_API_BASE pointing at an emulator or stripe-mock to try it out)")
	}
	pool, err := OpenPoolAs(ctx, cfg.DB.URL, WorkPoolMaxConns, WorkAppName)
	if err != nil {
		return nil, err
	}
	w := &Worker{Pool: pool, ownsPool: true}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	if err := CheckSchema(ctx, pool); err != nil {
		return nil, err
	}
	if w.RiverPool, err = OpenPoolAs(ctx, cfg.DB.URL, RiverPoolMaxConns, RiverAppName); err != nil {
		return nil, err
	}
	if w.MaintenancePool, err = OpenPoolAs(ctx, cfg.DB.URL, MaintenancePoolMaxConns, MaintenanceAppName); err != nil {
		return nil, err
	}
	// River's listener is hijacked out of its pool: one more than its size.
	WarnConnectionBudget(ctx, pool, int(pool.Config().MaxConns)+int(w.MaintenancePool.Config().MaxConns)+
		int(w.RiverPool.Config().MaxConns)+RiverListenerConns+BatchDelayConns, logger)
	WarnServerSettings(ctx, pool, logger)
	if w.claim, err = CheckBatchDelay(ctx, cfg.DB.URL, "work", cfg.Report.BatchDelay, logger); err != nil {
		return nil, err
	}
	w.Registry = NewRegistry(pool, logger)
	if w.Workers, err = NewWorkers(Pools{Work: pool, Maintenance: w.MaintenancePool, River: w.RiverPool}, cfg, logger, w.Registry); err != nil {
		return nil, err
	}
	if cfg.ListenAddr != "" {
		if w.stopHealth, err = ServeWorkHealth(ctx, cfg.ListenAddr, pool, w.Registry, logger); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// NewWorkerOn wires the workers, and River, on a pool the caller owns,
// their Stripe calls counted in reg (`overage dev` gives its server's).
func NewWorkerOn(pool *pgxpool.Pool, cfg *WorkConfig, logger *slog.Logger, reg *prometheus.Registry) (*Worker, error) {
	ws, err := NewWorkers(Pools{Work: pool}, cfg, logger, reg)
	if err != nil {
		return nil, err
	}
	return &Worker{Pool: pool, Workers: ws, Registry: reg}, nil
}

// Run runs the workers until ctx is done.
func (w *Worker) Run(ctx context.Context) error { return w.Workers.Run(ctx) }

// Close stops the health listener and releases what NewWorker opened.
// Call it once Run has returned: River has stopped then (its listener
// closed, no fetch or completion in flight), so its pool closes after it,
// and the workers' pool after River's.
func (w *Worker) Close() {
	if w.stopHealth != nil {
		w.stopHealth()
	}
	w.claim.Close()
	if w.RiverPool != nil {
		w.RiverPool.Close()
	}
	if w.MaintenancePool != nil {
		w.MaintenancePool.Close()
	}
	if w.ownsPool {
		w.Pool.Close()
	}
}

// Pools are the pools the workers run on: Work for the workers'
// statements, Maintenance for the maintenance queue's and River for
// River's own (either nil: on Work too).
type Pools struct {
	Work, Maintenance, River *pgxpool.Pool
}

// NewWorkers builds the Stripe client and the River workers on pools; the
// Stripe calls are counted in reg.
func NewWorkers(pools Pools, cfg *WorkConfig, logger *slog.Logger, reg prometheus.Registerer) (*workers.Workers, error) {
	sc, err := stripeclient.New(stripeclient.Config{
		SecretKey: cfg.Stripe.SecretKey,
		APIBase:   cfg.Stripe.APIBase,
		RateLimit: cfg.RateLimit,
		Logger:    logger,
	})
	if err != nil {
		return nil, fmt.Errorf("STRIPE_SECRET_KEY/STRIPE_API_BASE: %w", err)
	}
	wc := WorkersConfig(cfg, logger, metrics.InstrumentSender(sc, reg))
	wc.Alerts.Metrics = alerts.NewMetrics(reg)
	wc.RiverPool, wc.MaintenancePool = pools.River, pools.Maintenance
	w, err := workers.New(pools.Work, wc)
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	return w, nil
}

// WorkersConfig is cfg as the workers take it, reporting through stripe.
func WorkersConfig(cfg *WorkConfig, logger *slog.Logger, stripe stripeclient.Sender) workers.Config {
	return workers.Config{
		Logger:            logger,
		Stripe:            stripe,
		MeterInputEvent:   cfg.Meters.InputEvent,
		MeterOutputEvent:  cfg.Meters.OutputEvent,
		IdempotencyWindow: cfg.Window.IdempotencyWindow,
		SweepInterval:     cfg.SweepInterval,
		SweepGrace:        cfg.SweepGrace,
		MaxAttempts:       cfg.Report.MaxAttempts,
		ReportWorkers:     cfg.Workers,
		JobTimeout:        cfg.JobTimeout,
		BatchDelay:        cfg.Report.BatchDelay,
		BatchMax:          cfg.BatchMax,
		StreamIdleTimeout: cfg.StreamIdleTimeout,
		PeriodCloseGrace:  cfg.PeriodCloseGrace,
		Retention:         cfg.Retention,
	}
}
