// Package apitest starts the HTTP API for tests exactly as `overage serve`
// wires it — real PostgreSQL, real River outbox, real router — on a fresh
// database and a loopback port.
package apitest

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"riverqueue.com/riverui"

	"github.com/overage-billing/overage/api"
	"github.com/overage-billing/overage/finance"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/pgtest"
	"github.com/overage-billing/overage/metrics"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/webhooks"
)

// AdminToken is the ADMIN_TOKEN of test servers.
const AdminToken = "admin-test-token"

// WebhookSecret is the STRIPE_WEBHOOK_SECRET of test servers; sign test
// payloads with it (stripe-go's webhook.GenerateTestSignedPayload).
const WebhookSecret = "whsec_test_apitest_secret"

// Options changes how a test server is configured.
type Options struct {
	// WebhookSecret is STRIPE_WEBHOOK_SECRET; "" refuses every webhook
	// delivery with 503, as `overage serve` does without it.
	WebhookSecret string
}

// Server is a running test API.
type Server struct {
	URL     string
	Pool    *pgxpool.Pool
	DBURL   string
	Service *ingest.Service
}

// Start serves the API on a new database until t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	pool, dbURL := pgtest.NewPool(t)
	return StartOn(t, pool, dbURL)
}

// StartOn serves the API on pool (a pool through a pgtest.Proxy, say),
// whose database is dbURL.
// It is configured with WebhookSecret.
func StartOn(t testing.TB, pool *pgxpool.Pool, dbURL string) *Server {
	t.Helper()
	return StartWith(t, pool, dbURL, Options{WebhookSecret: WebhookSecret})
}

// StartWith serves the API on pool, whose database is dbURL, configured
// with opts.
func StartWith(t testing.TB, pool *pgxpool.Pool, dbURL string, opts Options) *Server {
	t.Helper()
	// Insert-only, as in `overage serve`.
	rc, err := river.NewClient[pgx.Tx](riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	ui, err := riverui.NewHandler(&riverui.HandlerOpts{Endpoints: riverui.NewEndpoints(rc, nil), Logger: quiet, Prefix: "/riverui"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := ui.Start(ctx); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	metrics.RegisterBacklog(reg, func(ctx context.Context) (metrics.Backlog, error) { return metrics.ReadBacklog(ctx, pool) }, quiet)

	svc := ingest.NewService(pool, outbox.NewInserter(rc, 5))
	h := api.NewRouter(api.Config{DB: pool, Handlers: []api.Mounter{
		ingest.NewHandler(ingest.HandlerConfig{Service: svc, Auth: tenants.NewStore(pool), AdminToken: AdminToken, Observer: metrics.NewIngest(reg)}),
		finance.NewHandler(finance.HandlerConfig{DB: pool, AdminToken: AdminToken}),
		tenants.NewHandler(tenants.HandlerConfig{Store: tenants.NewStore(pool), AdminToken: AdminToken}),
		webhooks.NewHandler(webhooks.HandlerConfig{Pool: pool, River: rc, Secret: opts.WebhookSecret}),
	},
		Metrics:    promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		RiverUI:    ui,
		AdminToken: AdminToken,
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &Server{URL: srv.URL, Pool: pool, DBURL: dbURL, Service: svc}
}

// Tenant creates a tenant named name, billed to cus_<name>, with the given
// included tokens per period.
func (s *Server) Tenant(t testing.TB, name string, includedInput, includedOutput int64) *tenants.Created {
	t.Helper()
	c, err := tenants.NewStore(s.Pool).Create(context.Background(), tenants.CreateParams{
		Name: name, StripeCustomerID: "cus_" + name, IncludedInputTokens: includedInput, IncludedOutputTokens: includedOutput,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
