// Package apitest starts the HTTP API for tests exactly as `overage serve`
// wires it — real PostgreSQL, real River outbox, real router — on a fresh
// database and a loopback port.
package apitest

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage/api"
	"github.com/overage-billing/overage/finance"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/pgtest"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/tenants"
)

// AdminToken is the ADMIN_TOKEN of test servers.
const AdminToken = "admin-test-token"

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
func StartOn(t testing.TB, pool *pgxpool.Pool, dbURL string) *Server {
	t.Helper()
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc := ingest.NewService(pool, outbox.NewInserter(rc, 5))
	h := api.NewRouter(api.Config{DB: pool, Handlers: []api.Mounter{
		ingest.NewHandler(ingest.HandlerConfig{Service: svc, Auth: tenants.NewStore(pool), AdminToken: AdminToken}),
		finance.NewHandler(finance.HandlerConfig{DB: pool, AdminToken: AdminToken}),
	}})
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
