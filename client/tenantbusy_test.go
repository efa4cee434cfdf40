package client_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage/client"
	"github.com/overage-billing/overage/internal/testkit/apitest"
	"github.com/overage-billing/overage/internal/testkit/metricstest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
)

// TestRetriesTenantBusy: against the real server with TENANT_MAX_INFLIGHT=1
// and one of the tenant's batches executing, Record is answered 429
// tenant-busy, waits the Retry-After and records the event once the
// tenant is free, under the same key.
func TestRetriesTenantBusy(t *testing.T) {
	t.Parallel()
	pool, dbURL := pgtest.NewPool(t)
	srv := apitest.StartWith(t, pool, dbURL, apitest.Options{TenantMaxInflight: 1})
	b := &bundle{srv: srv, apiKey: srv.Tenant(t, "acme", 0, 0).APIKey}
	ctx := context.Background()

	// Hold the tenant's one slot: a batch waiting for usage_logs, locked.
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Rollback(ctx) })
	if _, err := lock.Exec(ctx, `LOCK TABLE usage_logs IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	held := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/usage-events/batch",
			strings.NewReader(`{"events":[{"request_id":"held","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":1}]}`))
		req.Header.Set("Authorization", "Bearer "+b.apiKey)
		req.Header.Set("Idempotency-Key", "held")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			held <- 0
			return
		}
		res.Body.Close()
		held <- res.StatusCode
	}()
	polltest.Until(t, "the held batch to wait on usage_logs", 30*time.Second, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND NOT granted
			AND relation = 'usage_logs'::regclass AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
		return n > 0
	})

	type recorded struct {
		res *client.Result
		err error
	}
	// Attempts enough to outlast any wait below: each refusal is followed
	// by a second's Retry-After, and a loaded machine may take seconds to
	// see the first one.
	c, err := client.New(client.Config{BaseURL: srv.URL, APIKey: b.apiKey, MaxAttempts: 1000})
	if err != nil {
		t.Fatal(err)
	}
	// Bounded, so that a client that never gets through fails the test
	// rather than hang it.
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	done := make(chan recorded, 1)
	go func() {
		res, err := c.Record(rctx, ev, nil)
		done <- recorded{res, err}
	}()
	// At least one refusal, not exactly one: the client retries every
	// second, and a poll that looked for "1" could miss its second.
	polltest.Until(t, "the client to be refused as tenant-busy", 30*time.Second, func() bool {
		v, _ := metricstest.Value(http.DefaultClient, srv.URL+"/metrics", `overage_ingest_requests_total{outcome="tenant_busy"}`)
		n, err := strconv.ParseFloat(v, 64)
		return err == nil && n >= 1
	})
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if st := <-held; st != http.StatusAccepted {
		t.Fatalf("the held batch: %d", st)
	}
	r := <-done
	if r.err != nil || r.res.Attempts < 2 || r.res.Replayed {
		t.Fatalf("Record: %+v, %v; want recorded after a retry", r.res, r.err)
	}
	if n := b.logs(t); n != 2 {
		t.Fatalf("%d usage logs, want the held batch's and the event", n)
	}
}
