package workers

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/overage-billing/overage/outbox"
)

// sweepBatchSize bounds each read of the pending index and each batch
// insert of jobs.
const sweepBatchSize = 1000

// Sweeper is the periodic safety net of reporting. It parks pending logs
// whose first send is past Stripe's idempotency window (needs_review: a
// resend could bill twice), then requeues every other log still pending
// after the grace period — a job lost, discarded after its last attempt, or
// never run. The requeued job carries only the log id, so its sends carry
// the same keys as every earlier attempt. A log with a live job is skipped
// by River's unique insert.
type Sweeper struct {
	river.WorkerDefaults[outbox.SweepArgs]
	pool        *pgxpool.Pool
	window      windowGuard
	grace       time.Duration
	maxAttempts int
	logger      *slog.Logger
}

// SweepResult counts what one sweep did.
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
		s.logger.InfoContext(ctx, "sweep", "needs_review", res.Parked, "requeued", res.Requeued, "skipped_live_job", res.Skipped)
	}
	return nil
}

// Sweep runs one sweep, queueing with client.
func (s *Sweeper) Sweep(ctx context.Context, client *river.Client[pgx.Tx]) (SweepResult, error) {
	var res SweepResult
	for {
		ids, err := s.ids(ctx, `SELECT id FROM usage_logs WHERE billing_status = 'pending'
			AND first_attempt_at < now() - make_interval(secs => $1) LIMIT $2`, s.window.cutoff().Seconds(), sweepBatchSize)
		if err != nil {
			return res, err
		}
		n, err := park(ctx, s.pool, s.window, ids)
		if err != nil {
			return res, err
		}
		res.Parked += int(n)
		if len(ids) < sweepBatchSize {
			break
		}
	}

	var afterAt time.Time
	afterID := uuid.Nil
	for {
		rows, err := s.pool.Query(ctx, `SELECT id, created_at FROM usage_logs
			WHERE billing_status = 'pending' AND created_at < now() - make_interval(secs => $1)
				AND (created_at, id) > ($2, $3)
			ORDER BY created_at, id LIMIT $4`, s.grace.Seconds(), afterAt, afterID, sweepBatchSize)
		if err != nil {
			return res, fmt.Errorf("read pending usage logs: %w", err)
		}
		var params []river.InsertManyParams
		for rows.Next() {
			if err := rows.Scan(&afterID, &afterAt); err != nil {
				rows.Close()
				return res, fmt.Errorf("read pending usage logs: %w", err)
			}
			opts := outbox.ReportArgs{}.InsertOpts()
			opts.MaxAttempts = s.maxAttempts
			params = append(params, river.InsertManyParams{Args: outbox.ReportArgs{UsageLogID: afterID}, InsertOpts: &opts})
		}
		if err := rows.Err(); err != nil {
			return res, fmt.Errorf("read pending usage logs: %w", err)
		}
		if len(params) == 0 {
			break
		}
		inserted, err := client.InsertMany(ctx, params)
		if err != nil {
			return res, fmt.Errorf("requeue report jobs: %w", err)
		}
		for _, r := range inserted {
			if r.UniqueSkippedAsDuplicate {
				res.Skipped++
			} else {
				res.Requeued++
			}
		}
		if len(params) < sweepBatchSize {
			break
		}
	}
	return res, nil
}

func (s *Sweeper) ids(ctx context.Context, query string, args ...any) ([]uuid.UUID, error) {
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	return ids, nil
}
