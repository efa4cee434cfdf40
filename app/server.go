package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"riverqueue.com/riverui"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/alerts"
	"github.com/overage-billing/overage/api"
	"github.com/overage-billing/overage/finance"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/meters"
	"github.com/overage-billing/overage/metrics"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/webhooks"
)

// ShutdownTimeout bounds how long in-flight requests may take to finish
// after SIGTERM.
const ShutdownTimeout = 25 * time.Second

// Every request under /v1/ has a deadline. pgxpool has no acquire timeout:
// without one, a request finding the pool full (a stalled database, a
// burst) would wait without limit, and the client with it. Past the
// deadline the database call fails and the request answers 503 with
// Retry-After. An ingest transaction takes milliseconds; the finance
// report may read many rows.
const (
	RequestTimeout      = 5 * time.Second
	AdminRequestTimeout = time.Minute
)

// A client that stops reading its response cannot hold a connection and
// a goroutine for ever. Under /v1/ a response must be written within its
// request's deadline plus writeGrace (a per-response write deadline);
// anything else (metrics, River UI, health) within WriteTimeout. A client
// has ReadHeaderTimeout to send its headers and ReadTimeout its body.
const (
	ReadHeaderTimeout = 10 * time.Second
	ReadTimeout       = 30 * time.Second
	WriteTimeout      = 2 * time.Minute
	writeGrace        = 10 * time.Second
)

// Server is the HTTP API of `overage serve` on one listener. Tests start it
// on 127.0.0.1:0 and read Addr.
type Server struct {
	pool        *pgxpool.Pool
	adminPool   *pgxpool.Pool
	metricsPool *pgxpool.Pool
	ownsPool    bool
	riverUI     *riverui.Handler
	// uiLog is River UI's log: it is closed when Run returns, because River
	// UI's background queries stop on their own after the context ends and
	// may still log, and nothing may write to a caller's log afterwards.
	uiLog *closableHandler
	// Registry is the one /metrics serves; `overage dev` adds its workers'.
	Registry *prometheus.Registry
	// Ingest is the service behind POST /v1/usage-events.
	Ingest *ingest.Service
	// River is the insert-only client the API puts jobs in with.
	River  *river.Client[pgx.Tx]
	ln     net.Listener
	http   *http.Server
	logger *slog.Logger
	// claim is serve's REPORT_BATCH_DELAY (batchdelay.go), nil on a pool
	// the caller owns.
	claim *BatchDelayClaim
}

// NewServer connects, checks the schema is migrated (CheckSchema),
// listens and wires the API; Run serves it. It warns when its pools
// (ServeMaxConns) cannot fit in the server's max_connections, and logs an
// error when a live work or serve runs with another REPORT_BATCH_DELAY.
func NewServer(ctx context.Context, cfg *ServeConfig, logger *slog.Logger) (*Server, error) {
	var pools []*pgxpool.Pool
	closeAll := func() {
		for _, p := range pools {
			p.Close()
		}
	}
	for _, pc := range []struct {
		max  int32
		name string
	}{{ServeAPIMaxConns, ServeAppName}, {ServeAdminMaxConns, ServeAdminAppName}, {ServeMetricsMaxConns, ServeMetricsAppName}} {
		p, err := OpenPoolAs(ctx, cfg.DB.URL, pc.max, pc.name)
		if err != nil {
			closeAll()
			return nil, err
		}
		pools = append(pools, p)
	}
	// On an unmigrated database every request would fail while /readyz
	// says ready: refuse to start instead.
	if err := CheckSchema(ctx, pools[0]); err != nil {
		closeAll()
		return nil, err
	}
	total := 0
	for _, p := range pools {
		total += int(p.Config().MaxConns)
	}
	WarnConnectionBudget(ctx, pools[0], total+BatchDelayConns, logger)
	WarnServerSettings(ctx, pools[0], logger)
	claim, err := CheckBatchDelay(ctx, cfg.DB.URL, "serve", cfg.Ingest.Report.BatchDelay, logger)
	if err != nil {
		closeAll()
		return nil, err
	}
	s, err := wireServer(pools[0], pools[1], pools[2], cfg, logger)
	if err != nil {
		claim.Close()
		closeAll()
		return nil, err
	}
	s.ownsPool, s.claim = true, claim
	return s, nil
}

// NewServerOn wires the API on a pool the caller owns.
func NewServerOn(pool *pgxpool.Pool, cfg *ServeConfig, logger *slog.Logger) (*Server, error) {
	return wireServer(pool, pool, pool, cfg, logger)
}

// wireServer wires the API on pool, the finance statement on adminPool and
// the metrics' backlog gauges on metricsPool.
func wireServer(pool, adminPool, metricsPool *pgxpool.Pool, cfg *ServeConfig, logger *slog.Logger) (*Server, error) {
	// Insert-only: `serve` runs no workers, it only puts jobs in the
	// outbox inside its transactions.
	rc, err := NewInsertClient(pool, logger)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("LISTEN_ADDR=%s: %w", cfg.ListenAddr, err)
	}
	reg := NewRegistry(metricsPool, logger)
	uiLog := newClosableHandler(logger.Handler())
	ui, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(rc, nil), Logger: slog.New(uiLog), Prefix: "/riverui",
	})
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("river ui: %w", err)
	}
	svc := NewIngest(pool, rc, &cfg.Ingest)
	ts, err := NewTenants(pool, rc, cfg.Stripe, cfg.Ingest.Report, logger)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	handler := api.NewRouter(api.Config{
		DB:     pool,
		Logger: logger,
		Handlers: []api.Mounter{
			ingest.NewHandler(ingest.HandlerConfig{
				Service: svc, Auth: tenants.NewStore(pool), AdminToken: cfg.AdminToken, Logger: logger,
				Observer: metrics.NewIngest(reg), TenantMaxInflight: cfg.TenantMaxInflight,
			}),
			finance.NewHandler(finance.HandlerConfig{DB: adminPool, AdminToken: cfg.AdminToken, Logger: logger}),
			tenants.NewHandler(tenants.HandlerConfig{Store: ts, AdminToken: cfg.AdminToken, Logger: logger,
				OnUpdate: svc.Alerts().Forget}),
			meters.NewHandler(meters.HandlerConfig{
				Store: meters.NewStore(pool, cfg.Ingest.Meters.InputEvent, cfg.Ingest.Meters.OutputEvent), AdminToken: cfg.AdminToken, Logger: logger,
			}),
			alerts.NewHandler(alerts.HandlerConfig{DB: pool, Auth: ts, AdminToken: cfg.AdminToken, Logger: logger,
				EventNames: map[string]string{alerts.MeterInput: cfg.Ingest.Meters.InputEvent, alerts.MeterOutput: cfg.Ingest.Meters.OutputEvent}}),
			webhooks.NewHandler(webhooks.HandlerConfig{Pool: pool, River: rc, Secret: cfg.WebhookSecret, Logger: logger}),
		},
		Metrics:    promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		RiverUI:    ui,
		AdminToken: cfg.AdminToken,
	})
	return &Server{
		pool: pool, adminPool: adminPool, metricsPool: metricsPool, ln: ln, logger: logger, riverUI: ui, uiLog: uiLog, Registry: reg, Ingest: svc, River: rc,
		http: &http.Server{
			Handler:           withDeadlines(handler),
			ReadHeaderTimeout: ReadHeaderTimeout,
			ReadTimeout:       ReadTimeout,
			WriteTimeout:      WriteTimeout,
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
	defer s.uiLog.close()
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
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := s.http.Shutdown(sctx); err != nil {
		return fmt.Errorf("http shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Pools are the API's pool and the finance statement's (the same pool when
// the caller gave one).
func (s *Server) Pools() (api, admin *pgxpool.Pool) { return s.pool, s.adminPool }

// Close releases the database pools, if the server opened them.
func (s *Server) Close() {
	s.claim.Close()
	if s.ownsPool {
		s.pool.Close()
		s.adminPool.Close()
		s.metricsPool.Close()
	}
}

// withDeadlines gives each API request its deadline (RequestTimeout) and
// its response a write deadline writeGrace later.
func withDeadlines(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			next.ServeHTTP(w, r)
			return
		}
		d := RequestTimeout
		if strings.HasPrefix(r.URL.Path, "/v1/billing/") {
			d = AdminRequestTimeout
		}
		// Best effort: a ResponseWriter that cannot (a test recorder)
		// keeps the server's WriteTimeout.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d + writeGrace))
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// NewRegistry returns a Prometheus registry with the process metrics and
// the billing backlog read from pool at scrape time, at most once per
// metrics.BacklogCacheTTL.
func NewRegistry(pool *pgxpool.Pool, logger *slog.Logger) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics.RegisterBacklog(reg, func(ctx context.Context) (metrics.Backlog, error) { return metrics.ReadBacklog(ctx, pool) }, logger)
	return reg
}

// NewInsertClient is the insert-only River client of `overage serve`: it
// runs no workers, it only puts jobs in the outbox inside its callers'
// transactions.
func NewInsertClient(pool *pgxpool.Pool, logger *slog.Logger) (*river.Client[pgx.Tx], error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	rc, err := river.NewClient[pgx.Tx](riverpgxv5.New(pool), &river.Config{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	return rc, nil
}

// NewIngest is the ingest service of `overage serve` and `overage
// correct`: its report jobs go in through rc with cfg's attempts and batch
// delay.
func NewIngest(pool *pgxpool.Pool, rc *river.Client[pgx.Tx], cfg *IngestConfig) *ingest.Service {
	svc := ingest.NewService(pool, NewInserter(rc, cfg.Report))
	in, out := cmp.Or(cfg.Meters.InputEvent, overage.DefaultMeterInputEvent), cmp.Or(cfg.Meters.OutputEvent, overage.DefaultMeterOutputEvent)
	svc.UseMeters(meters.NewStore(pool, in, out))
	svc.SetCoalescing(cfg.Coalesce)
	svc.SetPeriodCloseGrace(cfg.PeriodCloseGrace)
	svc.SetAlerts(alerts.NewRecorder(rc))
	return svc
}

// NewInserter puts report jobs in the outbox through rc with cfg's
// attempts (REPORT_MAX_ATTEMPTS) and batch delay (REPORT_BATCH_DELAY).
func NewInserter(rc *river.Client[pgx.Tx], cfg ReportConfig) *outbox.Inserter {
	return outbox.NewInserter(rc, cfg.MaxAttempts).WithBatchDelay(cfg.BatchDelay)
}
