package review

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/outbox"
)

// A resend reads River's river_job table for one thing only: whether a
// report job of the log is running right now (refuseWhileJobRuns).

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

// queueReport queues the log's report job in tx. Report jobs are unique
// only while live (outbox.ReportArgs), so a log that had a finished job gets
// a new one, and a job still queued is reused rather than doubled.
func queueReport(ctx context.Context, tx pgx.Tx, inserter *outbox.Inserter, id uuid.UUID) (*QueuedJob, error) {
	res, err := inserter.InsertReportTx(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	return &QueuedJob{ID: res.Job.ID, State: string(res.Job.State), ScheduledAt: res.Job.ScheduledAt.UTC(), Existing: res.UniqueSkippedAsDuplicate}, nil
}
