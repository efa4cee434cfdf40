package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/outbox"
)

// makeDue rests on River fetching an available job only once its
// scheduled_at has passed, and then at its next fetch poll rather than at
// its scheduler's next pass (every 5 s). If an upgrade of River changed
// either, a report would run before its batch period ends (logs of the
// period left to the next report) or up to 5 s late: this test fails.
func TestRiverRunsAnAvailableJobAtItsScheduledTimeNotBefore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	ran := make(chan time.Time, 1)
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[outbox.ReportArgs]) error {
		ran <- time.Now()
		return nil
	}))
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Workers:           workers,
		Queues:            map[string]river.QueueConfig{outbox.QueueReport: {MaxWorkers: 1}},
		FetchPollInterval: 50 * time.Millisecond,
		FetchCooldown:     50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rc.Stop(context.Background()) })
	// A 2-second batch period: the job is due at its end.
	ins := outbox.NewInserter(rc, 5).WithBatchDelay(2 * time.Second)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ins.InsertReportsTx(ctx, tx, uuid.New(), []uuid.UUID{uuid.New()})
	}); err != nil {
		t.Fatal(err)
	}
	var state string
	var due time.Time
	if err := pool.QueryRow(ctx, `SELECT state::text, scheduled_at FROM river_job WHERE kind = $1`, outbox.ReportArgs{}.Kind()).Scan(&state, &due); err != nil {
		t.Fatal(err)
	}
	if state != "available" || !due.After(time.Now()) {
		t.Fatalf("the report job is %s, due %s: want available with a scheduled_at ahead", state, due)
	}
	select {
	case at := <-ran:
		if at.Before(due) {
			t.Fatalf("River ran the job %v before its scheduled_at", due.Sub(at))
		}
		if late := at.Sub(due); late > 2*time.Second {
			t.Fatalf("River ran the job %v after its scheduled_at: not at its fetch poll", late)
		}
	case <-time.After(time.Until(due) + 10*time.Second):
		t.Fatal("the report job never ran")
	}
}
