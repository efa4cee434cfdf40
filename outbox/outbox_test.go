package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/outbox"
)

// The first ingest transaction of a tenant's batch period queues the
// report job; a concurrent one waits for it and, when it rolls back,
// queues the job itself; later ones of the period add nothing. The job is
// due (available) at the end of its period.
func TestInsertReportsTxQueuesOneJobPerTenantAndPeriod(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// A day-long period: every transaction below falls in the same one
	// (unless the test straddles midnight UTC).
	ins := outbox.NewInserter(rc, 5).WithBatchDelay(24 * time.Hour)
	tenant := uuid.New()
	logs := []uuid.UUID{uuid.New()}

	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ins.InsertReportsTx(ctx, tx1, tenant, logs); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		second <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ins.InsertReportsTx(ctx, tx, tenant, logs) })
	}()
	select {
	case err := <-second:
		t.Fatalf("the second transaction did not wait for the first: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := tx1.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ins.InsertReportsTx(ctx, tx, tenant, logs) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ins.InsertReportsTx(ctx, tx, uuid.New(), logs) }); err != nil {
		t.Fatal(err)
	}
	var jobs, available, forTenant int
	var due time.Time
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'available'),
			count(*) FILTER (WHERE args->>'tenant_id' = $2), max(scheduled_at)
		FROM river_job WHERE kind = $1`, outbox.ReportArgs{}.Kind(), tenant.String()).Scan(&jobs, &available, &forTenant, &due); err != nil {
		t.Fatal(err)
	}
	if jobs != 2 || available != 2 || forTenant != 1 {
		t.Fatalf("%d report jobs (%d available, %d of the tenant), want one per tenant, available", jobs, available, forTenant)
	}
	if want := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour); !due.Equal(want) {
		t.Fatalf("job due at %s, want the end of the period %s", due, want)
	}
	// Once the job runs and forgets the period, a straggler of the period
	// queues again, and River's uniqueness decides.
	if err := outbox.ForgetBatches(ctx, pool, tenant, due); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ins.InsertReportsTx(ctx, tx, tenant, logs) }); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = $1 AND args->>'tenant_id' = $2`,
		outbox.ReportArgs{}.Kind(), tenant.String()).Scan(&forTenant); err != nil || forTenant != 1 {
		t.Fatalf("%d jobs of the tenant after a straggler, want the live one reused (%v)", forTenant, err)
	}
}

// One tenant's ingest transactions join the period's committed report job
// without waiting for each other: a second open transaction that has
// queued its report must not hold up a third. River's unique insert alone
// locks the job row until commit, so the third would wait out lock_timeout.
func TestInsertReportsTxJoinsTheCommittedJobWithoutWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// A day's period: the test does not straddle two unless run at midnight.
	ins := outbox.NewInserter(rc, 5).WithBatchDelay(24 * time.Hour)
	tenant, logs := uuid.New(), []uuid.UUID{uuid.New()}
	queue := func(ins *outbox.Inserter) pgx.Tx {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '2s'"); err != nil {
			t.Fatal(err)
		}
		if err := ins.InsertReportsTx(ctx, tx, tenant, logs); err != nil {
			t.Fatalf("InsertReportsTx: %v", err)
		}
		return tx
	}
	commit := func(tx pgx.Tx) {
		t.Helper()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}

	commit(queue(ins))
	second := queue(ins)
	third := queue(ins) // blocked by second's row lock without the join
	commit(third)
	commit(second)
	// Another process, which has not queued the job itself, joins it too.
	commit(queue(outbox.NewInserter(rc, 5).WithBatchDelay(24 * time.Hour)))
	if n := reportJobs(t, pool); n != 1 {
		t.Fatalf("report jobs = %d, want the period's one", n)
	}

}

func reportJobs(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM river_job WHERE kind = $1", outbox.ReportArgs{}.Kind()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
