package workers

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/usagelog"
)

// sweepBatchSize bounds each read of reports past the window.
const sweepBatchSize = 1000

// Sweeper is the periodic safety net of reporting. It parks open reports
// whose first send is past Stripe's idempotency window (their logs become
// needs_review: a resend could bill twice), then queues the report job of
// every tenant with a log still pending after the grace period — a job
// lost, discarded after its last attempt, or never run. That job sends the
// tenant's open reports again with their own members, value and key, and
// forms new reports of the logs in none yet. A tenant whose job is already
// queued for this interval is skipped by River's unique insert.
type Sweeper struct {
	river.WorkerDefaults[outbox.SweepArgs]
	store    *usagelog.Store
	guard    usagelog.Guard
	grace    time.Duration
	inserter *outbox.Inserter
	logger   *slog.Logger
}

// SweepResult counts what one sweep did: logs parked, tenants whose report
// job was queued, and tenants whose job was already queued.
type SweepResult struct {
	Parked, Requeued, Skipped int
}

// Work implements river.Worker.
func (s *Sweeper) Work(ctx context.Context, _ *river.Job[outbox.SweepArgs]) error {
	res, err := s.Sweep(ctx, river.ClientFromContext[pgx.Tx](ctx))
	if err != nil {
		return err
	}
	if res.Parked+res.Requeued > 0 {
		s.logger.InfoContext(ctx, "sweep", "needs_review", res.Parked, "requeued_tenants", res.Requeued, "skipped_live_job", res.Skipped)
	}
	return nil
}

// Sweep runs one sweep, queueing with client.
func (s *Sweeper) Sweep(ctx context.Context, client *river.Client[pgx.Tx]) (SweepResult, error) {
	var res SweepResult
	for {
		reports, err := s.store.ExpiredReports(ctx, s.guard, sweepBatchSize)
		if err != nil {
			return res, err
		}
		for _, r := range reports {
			n, err := s.store.Park(ctx, r, s.guard)
			if err != nil {
				return res, err
			}
			res.Parked += int(n)
		}
		if len(reports) < sweepBatchSize {
			break
		}
	}
	tenants, err := s.store.TenantsPendingSince(ctx, s.grace)
	if err != nil {
		return res, err
	}
	if len(tenants) == 0 {
		return res, nil
	}
	var inserted []*rivertype.JobInsertResult
	if err := pgx.BeginFunc(ctx, s.store.Pool(), func(tx pgx.Tx) error {
		inserted, err = s.inserter.InsertTenantReportsTx(ctx, tx, client, tenants)
		return err
	}); err != nil {
		return res, fmt.Errorf("requeue report jobs: %w", err)
	}
	for _, r := range inserted {
		if r.UniqueSkippedAsDuplicate {
			res.Skipped++
		} else {
			res.Requeued++
		}
	}
	return res, nil
}
