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

	"github.com/overage-billing/overage/internal/pgtest"
	"github.com/overage-billing/overage/outbox"
)

// One tenant's ingest transactions join the period's committed report job
// without waiting for each other: a second open transaction that has
// queued its report must not hold up a third. River's unique insert alone
// locks the job row until commit, so the third would wait out lock_timeout.
// The join skips exactly what River skips: once the job has left River's
// unique states (completed), the next transaction queues a new one.
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

	if _, err := pool.Exec(ctx, "UPDATE river_job SET state = 'completed', finalized_at = now() WHERE kind = $1", outbox.ReportArgs{}.Kind()); err != nil {
		t.Fatal(err)
	}
	commit(queue(ins))
	if n := reportJobs(t, pool); n != 2 {
		t.Fatalf("report jobs = %d after the first completed, want a new one", n)
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
