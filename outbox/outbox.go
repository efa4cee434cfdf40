// Package outbox defines the River job kinds of the pipeline and inserts
// them inside a caller's transaction, so a job exists exactly when the row
// it works on does: committed together or rolled back together.
//
// Job args carry ids only. The row in PostgreSQL is the truth a worker
// reads when it runs; args copied at insert time could be stale by then.
package outbox

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// Queues. Reports get their own queue so a backlog of maintenance work
// never delays billing, and webhooks (one worker) stay in order.
const (
	QueueReport      = "report"
	QueueMaintenance = "maintenance"
	// QueueWebhooks must run with MaxWorkers 1: Stripe events are applied
	// one at a time, in arrival order.
	QueueWebhooks = "webhooks"
)

// ReportArgs asks a worker to send a usage log's overage to Stripe.
type ReportArgs struct {
	UsageLogID uuid.UUID `json:"usage_log_id" river:"unique"`
}

// Kind implements river.JobArgs.
func (ReportArgs) Kind() string { return "overage.report_usage" }

// InsertOpts makes a report job unique by its usage log while it is live
// (not while it is completed, cancelled or discarded), so the sweep and
// ingest never queue the same log twice at once, yet a log that is pending
// again — a discarded job, an operator's resend — can be queued at once.
// River's uniqueness is not the record of what was billed; the usage log's
// billing_status is.
func (ReportArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue: QueueReport,
		UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{
			rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable,
			rivertype.JobStateRunning, rivertype.JobStateScheduled,
		}},
	}
}

// ExpireIdempotencyKeysArgs asks a worker to delete expired idempotency
// records in bounded batches.
type ExpireIdempotencyKeysArgs struct{}

// Kind implements river.JobArgs.
func (ExpireIdempotencyKeysArgs) Kind() string { return "overage.expire_idempotency_keys" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (ExpireIdempotencyKeysArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueMaintenance}
}

// Inserter puts outbox jobs in callers' transactions.
type Inserter struct {
	client      *river.Client[pgx.Tx]
	maxAttempts int
}

// NewInserter returns an Inserter. client may be insert-only (no queues);
// maxAttempts is REPORT_MAX_ATTEMPTS.
func NewInserter(client *river.Client[pgx.Tx], maxAttempts int) *Inserter {
	return &Inserter{client: client, maxAttempts: maxAttempts}
}

// InsertReportTx queues the report of a usage log in tx. A live job for the
// same log is returned instead of a second one (UniqueSkippedAsDuplicate).
func (i *Inserter) InsertReportTx(ctx context.Context, tx pgx.Tx, usageLogID uuid.UUID) (*rivertype.JobInsertResult, error) {
	opts := ReportArgs{}.InsertOpts()
	opts.MaxAttempts = i.maxAttempts
	res, err := i.client.InsertTx(ctx, tx, ReportArgs{UsageLogID: usageLogID}, &opts)
	if err != nil {
		return nil, fmt.Errorf("insert report job for usage log %s: %w", usageLogID, err)
	}
	return res, nil
}

// InsertReportsTx queues, in tx, the reporting of the usage logs one ingest
// transaction wrote for tenantID that have overage to bill (pending; a
// not_billable log is never reported): one for a single event, up to 1,000
// for a batch, possibly none. The ingest calls it exactly once per
// transaction that records logs, so how reports are shaped — today one
// unique job per log — stays this function's business: callers must not
// assume a job per log.
//
// All jobs go in one statement (River's InsertManyTx). A unique key twice
// in one such statement aborts it (SQLSTATE 21000), so repeated ids are
// dropped first; a live job already queued for a log is kept, not doubled.
func (i *Inserter) InsertReportsTx(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, usageLogIDs []uuid.UUID) error {
	if len(usageLogIDs) == 0 {
		return nil
	}
	opts := ReportArgs{}.InsertOpts()
	opts.MaxAttempts = i.maxAttempts
	seen := make(map[uuid.UUID]bool, len(usageLogIDs))
	params := make([]river.InsertManyParams, 0, len(usageLogIDs))
	for _, id := range usageLogIDs {
		if seen[id] {
			continue
		}
		seen[id] = true
		params = append(params, river.InsertManyParams{Args: ReportArgs{UsageLogID: id}, InsertOpts: &opts})
	}
	if _, err := i.client.InsertManyTx(ctx, tx, params); err != nil {
		return fmt.Errorf("insert %d report jobs of tenant %s: %w", len(params), tenantID, err)
	}
	return nil
}

// SweepArgs asks a worker to requeue usage logs still unbilled after the
// grace period and to park those past Stripe's idempotency window.
type SweepArgs struct{}

// Kind implements river.JobArgs.
func (SweepArgs) Kind() string { return "overage.sweep" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (SweepArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueMaintenance}
}

// ProcessWebhookArgs asks the webhook processor to apply stored Stripe
// events in arrival order, up to and including the event with this seq.
// The event row's processed_at, not this job, records what was done.
type ProcessWebhookArgs struct {
	Seq int64 `json:"seq" river:"unique"`
}

// Kind implements river.JobArgs.
func (ProcessWebhookArgs) Kind() string { return "overage.process_stripe_webhook" }

// InsertOpts makes the job unique by its event while it is live, so a
// duplicate delivery of an unprocessed event adds a job only when none is
// left to process it.
func (ProcessWebhookArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue: QueueWebhooks,
		// Transient failures (the database) are retried for about a day;
		// every later delivery and every later event's job also drains it.
		MaxAttempts: 25,
		UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{
			rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable,
			rivertype.JobStateRunning, rivertype.JobStateScheduled,
		}},
	}
}

// ExpireWebhookEventsArgs asks a worker to delete webhook events past their
// retention, in bounded batches.
type ExpireWebhookEventsArgs struct{}

// Kind implements river.JobArgs.
func (ExpireWebhookEventsArgs) Kind() string { return "overage.expire_webhook_events" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (ExpireWebhookEventsArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueMaintenance}
}
