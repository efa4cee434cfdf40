package review

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/outbox"
)

// Report jobs are unique by usage log (outbox.ReportArgs) in River's
// default unique states, which include "completed". A log under review
// usually has a finished report job: completed (the worker parked it, or
// ran after the sweep had parked it), cancelled (a permanent failure) or
// discarded. Until River's cleaner deletes a completed job (a day later),
// it would make outbox.Inserter.InsertReportTx skip the resend's job as a
// duplicate, silently, and so would every sweep. So, in the resend's
// transaction, the finished report jobs of the log give up their unique
// key (the rows stay, for history, until River's cleaner removes them), and
// a live job — one the sweep left queued — is reused. These statements
// read and write River's river_job table directly: outbox.Inserter does not
// say whether it inserted or skipped, and this package may not change it.

// liveStates are the job states River's unique insert counts besides
// completed: a job in one of them will still run.
var liveStates = []string{"available", "pending", "retryable", "running", "scheduled"}

func reportJobArgs(id uuid.UUID) map[string]string {
	return map[string]string{"usage_log_id": id.String()}
}

// refuseWhileJobRuns refuses a resend while a report job of the log is
// running: it may already have read the log under review and be about to
// complete without sending, and a running job would make the resend's job
// a skipped duplicate. Jobs are bounded by REPORT_JOB_TIMEOUT.
func refuseWhileJobRuns(ctx context.Context, tx pgx.Tx, id uuid.UUID) error {
	var running bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM river_job
			WHERE kind = $1 AND args @> $2::jsonb AND state = 'running')`,
		outbox.ReportArgs{}.Kind(), reportJobArgs(id)).Scan(&running); err != nil {
		return fmt.Errorf("read report jobs of usage log %s: %w", id, err)
	}
	if running {
		e := overage.Errorf(overage.ECONFLICT, "report-job-running",
			"a report job of usage log %s is running right now; try again when it has finished (within REPORT_JOB_TIMEOUT)", id)
		e.RetryAfter = 5 * time.Second
		return e
	}
	return nil
}

// queueReport makes sure a report job will send the log: a live one is
// reused, otherwise one is inserted through the outbox, in tx.
func queueReport(ctx context.Context, tx pgx.Tx, inserter *outbox.Inserter, id uuid.UUID) (*QueuedJob, error) {
	kind, args := outbox.ReportArgs{}.Kind(), reportJobArgs(id)
	live, err := liveReportJob(ctx, tx, kind, id)
	if err != nil {
		return nil, err
	}
	if live != nil {
		live.Existing = true
		return live, nil
	}
	if _, err := tx.Exec(ctx, `UPDATE river_job SET unique_key = NULL
		WHERE kind = $1 AND args @> $2::jsonb AND state IN ('completed', 'cancelled', 'discarded') AND unique_key IS NOT NULL`,
		kind, args); err != nil {
		return nil, fmt.Errorf("release finished report jobs of usage log %s: %w", id, err)
	}
	if err := inserter.InsertReportTx(ctx, tx, id); err != nil {
		return nil, err
	}
	job, err := liveReportJob(ctx, tx, kind, id)
	if err != nil {
		return nil, err
	}
	if job == nil {
		return nil, fmt.Errorf("queue report job for usage log %s: River inserted none", id)
	}
	return job, nil
}

func liveReportJob(ctx context.Context, tx pgx.Tx, kind string, id uuid.UUID) (*QueuedJob, error) {
	var j QueuedJob
	err := tx.QueryRow(ctx, `SELECT id, state::text, scheduled_at FROM river_job
		WHERE kind = $1 AND args @> $2::jsonb AND state::text = ANY($3)
		ORDER BY id DESC LIMIT 1`, kind, reportJobArgs(id), liveStates).Scan(&j.ID, &j.State, &j.ScheduledAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read report jobs of usage log %s: %w", id, err)
	}
	j.ScheduledAt = j.ScheduledAt.UTC()
	return &j, nil
}
