// Package apitest starts the HTTP API for tests through app, the wiring of
// `overage serve` — real PostgreSQL, real River outbox, real router — on a
// fresh database and a loopback port.
package apitest

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jackc/pgx/v5"
	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/tenants"
	"github.com/riverqueue/river"
)

// AdminToken is the ADMIN_TOKEN of test servers.
const AdminToken = "admin-test-token-0123456789abcdef0123"

// WebhookSecret is the STRIPE_WEBHOOK_SECRET of test servers; sign test
// payloads with it (stripe-go's webhook.GenerateTestSignedPayload).
const WebhookSecret = "whsec_test_apitest_secret"

// Options changes how a test server is configured.
type Options struct {
	// WebhookSecret is STRIPE_WEBHOOK_SECRET; "" refuses every webhook
	// delivery with 503, as `overage serve` does without it.
	WebhookSecret string
	// TenantMaxInflight is TENANT_MAX_INFLIGHT; 0 keeps the default.
	TenantMaxInflight int
	// StripeAPIBase, when set, is STRIPE_API_BASE with a test
	// STRIPE_SECRET_KEY: the tenant endpoints then ask that Stripe (an
	// emulator) before lifting a suspension.
	StripeAPIBase string
}

// Server is a running test API.
type Server struct {
	URL     string
	Pool    *pgxpool.Pool
	DBURL   string
	Service *ingest.Service
	// River is the server's insert-only River client: list its jobs with it.
	River *river.Client[pgx.Tx]
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
// with opts. It is app.NewServerOn, the wiring of `overage serve`, with the
// configuration's defaults.
func StartWith(t testing.TB, pool *pgxpool.Pool, dbURL string, opts Options) *Server {
	t.Helper()
	env := vars{"LISTEN_ADDR": "127.0.0.1:0", "ADMIN_TOKEN": AdminToken, "STRIPE_WEBHOOK_SECRET": opts.WebhookSecret}
	if opts.StripeAPIBase != "" {
		env["STRIPE_SECRET_KEY"], env["STRIPE_API_BASE"] = "sk_test_123", opts.StripeAPIBase
	}
	if opts.TenantMaxInflight > 0 {
		env["TENANT_MAX_INFLIGHT"] = strconv.Itoa(opts.TenantMaxInflight)
	}
	var cfg app.ServeConfig
	if err := cfg.Read(env.get); err != nil {
		t.Fatal(err)
	}
	srv, err := app.NewServerOn(pool, &cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	RunUntilCleanup(t, srv)
	return &Server{URL: "http://" + srv.Addr(), Pool: pool, DBURL: dbURL, Service: srv.Ingest, River: srv.River}
}

// RunUntilCleanup serves srv until t ends, then shuts it down as SIGTERM
// would, failing t if the shutdown fails.
func RunUntilCleanup(t testing.TB, srv *app.Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server shutdown: %v", err)
		}
	})
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

// vars is an environment given as a map.
type vars map[string]string

func (v vars) get(k string) string { return v[k] }
