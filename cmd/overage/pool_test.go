package main

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// startServerOn runs `overage serve` in-process on dbURL, so a test can
// reach into its pools.
func startServerOn(t *testing.T, dbURL string) *app.Server {
	t.Helper()
	srv, _ := startServer(t, map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0", "ADMIN_TOKEN": poolTestAdminToken})
	return srv
}

// poolTestAdminToken is the ADMIN_TOKEN of these servers.
const poolTestAdminToken = "admin-token-for-the-pool-test-0123456789"

// holdAll acquires every connection of pool until t ends: a stalled
// database, or slow queries in flight on all of them.
func holdAll(t *testing.T, pool *pgxpool.Pool) func() {
	t.Helper()
	var held []*pgxpool.Conn
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			for _, c := range held {
				c.Release()
			}
		})
	}
	t.Cleanup(release)
	return release
}

// With every connection taken, ingest answers 503 with Retry-After at its
// deadline instead of waiting for a connection without limit, and takes
// the same event once a connection is free.
func TestIngestAnswers503WhenThePoolIsFull(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	w := newFaultWorld(t, dbURL)
	srv := startServerOn(t, dbURL+"&pool_max_conns=3")
	body := `{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":5}`
	release := holdAll(t, apiPool(srv))

	a := postUsage(srv.Addr(), w.apiKey, "k1", body)
	if a.err != nil || a.status != http.StatusServiceUnavailable || a.retryAfter == "" {
		t.Fatalf("pool full: %d %q %v %s", a.status, a.retryAfter, a.err, a.body)
	}
	if a.took < app.RequestTimeout-time.Second || a.took > app.RequestTimeout+2*time.Second {
		t.Fatalf("pool full: answered after %s, want about %s", a.took, app.RequestTimeout)
	}
	t.Logf("pool full: 503 after %s", a.took)

	release()
	if a := postUsage(srv.Addr(), w.apiKey, "k1", body); a.status != http.StatusAccepted {
		t.Fatalf("pool free again: %d %s", a.status, a.body)
	}
	if n := w.count(t, "SELECT count(*) FROM usage_logs"); n != 1 {
		t.Fatalf("%d usage logs", n)
	}
}

// Finance statements run on a pool of their own: with all of its connections
// busy and more statements queued behind them, ingest answers as fast as
// ever.
func TestSlowStatusDoesNotStarveIngest(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	w := newFaultWorld(t, dbURL)
	srv := startServerOn(t, dbURL+"&pool_max_conns=3")
	holdAll(t, adminPool(srv))

	statusCtx, cancelStatus := context.WithCancel(context.Background())
	defer cancelStatus()
	var reports sync.WaitGroup
	for range 8 {
		reports.Add(1)
		go func() {
			defer reports.Done()
			req, _ := http.NewRequestWithContext(statusCtx, http.MethodGet, "http://"+srv.Addr()+"/v1/billing/status", nil)
			req.Header.Set("Authorization", "Bearer "+poolTestAdminToken)
			if res, err := httpClient.Do(req); err == nil {
				res.Body.Close()
			}
		}()
	}
	var worst time.Duration
	for i := range 30 {
		a := postUsage(srv.Addr(), w.apiKey, "k"+string(rune('a'+i)), `{"user_id":"u","model_id":"m","input_tokens":10,"output_tokens":5}`)
		if a.status != http.StatusAccepted {
			t.Fatalf("event %d while reports wait: %d %v %s", i, a.status, a.err, a.body)
		}
		worst = max(worst, a.took)
	}
	// Far below app.RequestTimeout, the wait of a request starved of a
	// connection.
	if worst > app.RequestTimeout/2 {
		t.Fatalf("slowest event took %s while reports waited", worst)
	}
	t.Logf("30 events while 8 reports waited on a full admin pool: slowest %s", worst)
	cancelStatus()
	reports.Wait()
}

func apiPool(s *app.Server) *pgxpool.Pool   { p, _ := s.Pools(); return p }
func adminPool(s *app.Server) *pgxpool.Pool { _, p := s.Pools(); return p }
