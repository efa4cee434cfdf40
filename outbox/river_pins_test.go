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
	"github.com/overage-billing/overage/internal/testkit/polltest"
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
	// A 2-second batch period: the job is due at its end. A job inserted
	// within a few hundred milliseconds of its window's end cannot tell
	// running early from running on time: then it is removed (or has
	// run), the window is waited out, and a job of the next window is
	// inserted instead.
	ins := outbox.NewInserter(rc, 5).WithBatchDelay(2 * time.Second)
	var state string
	var due time.Time
	for attempt := 0; ; attempt++ {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return ins.InsertReportsTx(ctx, tx, uuid.New(), []uuid.UUID{uuid.New()})
		}); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT state::text, scheduled_at FROM river_job WHERE kind = $1 ORDER BY id DESC LIMIT 1`,
			outbox.ReportArgs{}.Kind()).Scan(&state, &due); err != nil {
			t.Fatal(err)
		}
		if time.Until(due) > 300*time.Millisecond || attempt == 5 {
			break
		}
		if _, err := pool.Exec(ctx, `DELETE FROM river_job WHERE kind = $1`, outbox.ReportArgs{}.Kind()); err != nil {
			t.Fatal(err)
		}
		polltest.Until(t, "the batch window to end", 5*time.Second, func() bool { return time.Now().After(due) })
		select {
		case <-ran: // the removed job ran before it was removed
		default:
		}
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
