package app_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/syncbuf"
)

// TestRiverRunsWithTheWorkersPoolHeld: billing at full load holds every
// connection of the workers' pool (200 report workers against 18
// connections); River, on a pool of its own, still elects a leader, the
// leader still enqueues the periodic jobs (the idempotency partitions'
// among them, which keep ingest's partitions ahead), the producers still
// fetch them, and the maintenance queue's jobs, on a pool of their own
// too, still run to completion, on backends named MaintenanceAppName.
func TestRiverRunsWithTheWorkersPoolHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	var wc app.WorkConfig
	if err := wc.Read(envOf(map[string]string{"DATABASE_URL": dbURL,
		"STRIPE_SECRET_KEY": "sk_test_riverpool", "STRIPE_API_BASE": "http://127.0.0.1:1"})); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	w, err := app.NewWorker(ctx, &wc, slog.New(slog.NewJSONHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.RiverPool == nil || w.RiverPool == w.Pool {
		t.Fatal("River runs on the workers' pool")
	}
	if got := w.RiverPool.Config().MaxConns; got != app.RiverPoolMaxConns {
		t.Fatalf("River's pool has %d connections, want RiverPoolMaxConns (%d)", got, app.RiverPoolMaxConns)
	}
	if got := w.Pool.Config().MaxConns; got != app.WorkPoolMaxConns {
		t.Fatalf("the workers' pool has %d connections, want WorkPoolMaxConns (%d)", got, app.WorkPoolMaxConns)
	}
	if w.MaintenancePool == nil || w.MaintenancePool == w.Pool || w.MaintenancePool == w.RiverPool {
		t.Fatal("the maintenance queue runs on another pool's connections")
	}
	if got := w.MaintenancePool.Config().MaxConns; got != app.MaintenancePoolMaxConns {
		t.Fatalf("the maintenance pool has %d connections, want MaintenancePoolMaxConns (%d)", got, app.MaintenancePoolMaxConns)
	}

	var held []*pgxpool.Conn
	release := func() {
		for _, c := range held {
			c.Release()
		}
		held = nil
	}
	defer release()
	for range app.WorkPoolMaxConns {
		c, err := w.Pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if st := w.Pool.Stat(); st.AcquiredConns() != st.MaxConns() {
		t.Fatalf("the workers' pool is not full: %d of %d acquired", st.AcquiredConns(), st.MaxConns())
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()

	// Watched from a connection of neither pool.
	obs, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close(ctx)
	jobState := func() string {
		var state string
		err := obs.QueryRow(ctx, `SELECT coalesce(max(state::text), '') FROM river_job WHERE kind = 'overage.expire_idempotency_keys'`).Scan(&state)
		if err != nil {
			t.Fatal(err)
		}
		return state
	}
	polltest.Until(t, "River to elect a leader that enqueues the idempotency partitions' job, fetch it and run it to completion, with the workers' pool held", 30*time.Second,
		func() bool { return jobState() == "completed" })
	var leaders int
	if err := obs.QueryRow(ctx, `SELECT count(*) FROM river_leader`).Scan(&leaders); err != nil || leaders != 1 {
		t.Fatalf("%d leaders recorded (%v), want 1", leaders, err)
	}
	if st := w.Pool.Stat(); st.AcquiredConns() != st.MaxConns() {
		t.Fatalf("the workers' pool was let go: %d of %d acquired", st.AcquiredConns(), st.MaxConns())
	}
	// Each pool's backends carry its name, the maintenance pool's among them.
	names := map[string]bool{}
	rows, err := obs.Query(ctx, `SELECT DISTINCT application_name FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names[n] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{app.WorkAppName, app.MaintenanceAppName, app.RiverAppName} {
		if !names[want] {
			t.Errorf("no backend named %q among %v", want, names)
		}
	}
	release()
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, logs)
	}
}

// A pool_max_conns in DATABASE_URL sizes every pool of work, River's and
// maintenance's too.
func TestPoolMaxConnsSizesEveryPoolOfWork(t *testing.T) {
	t.Parallel()
	var wc app.WorkConfig
	if err := wc.Read(envOf(map[string]string{"DATABASE_URL": pgtest.NewDatabase(t) + "&pool_max_conns=2",
		"STRIPE_SECRET_KEY": "sk_test_riverpool", "STRIPE_API_BASE": "http://127.0.0.1:1"})); err != nil {
		t.Fatal(err)
	}
	w, err := app.NewWorker(context.Background(), &wc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if a, b, c := w.Pool.Config().MaxConns, w.RiverPool.Config().MaxConns, w.MaintenancePool.Config().MaxConns; a != 2 || b != 2 || c != 2 {
		t.Fatalf("pool_max_conns=2: the workers' pool %d, River's %d, maintenance's %d, want 2 each", a, b, c)
	}
}
