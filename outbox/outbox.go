// Package outbox defines the River job kinds of the pipeline. A job that
// works on rows — a tenant's report job, a webhook event's processing job —
// is inserted only inside the transaction that writes those rows (ingest's,
// review's, the sweep's own, the webhook handler's), so the job exists
// exactly when its rows do: committed together or rolled back together.
// The maintenance jobs (the sweep, the expiries) work on no row of their
// own: River's periodic scheduler inserts them, outside any transaction.
//
// Job args carry ids only. The row in PostgreSQL is the truth a worker
// reads when it runs; args copied at insert time could be stale by then.
package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// ReportArgs asks a worker to report a tenant's pending usage logs: send
// its open reports again and form new ones of the logs in no report yet
// (package usagelog). The args name the tenant, not a log: one job covers
// every log of the tenant ingested within REPORT_BATCH_DELAY.
type ReportArgs struct {
	TenantID uuid.UUID `json:"tenant_id" river:"unique"`
	// Batch is the end of the batch period the job gathers, when it is
	// scheduled to run. It makes the job unique per tenant and period
	// (River's ByPeriod cannot go below a second).
	Batch time.Time `json:"batch" river:"unique"`
}

// Kind implements river.JobArgs. It differs from the per-log job of earlier
// versions ("overage.report_usage"), whose logs the sweep requeues.
func (ReportArgs) Kind() string { return "overage.report_tenant" }

// InsertOpts makes a report job unique by its tenant and batch period while
// it waits or runs: every ingest transaction of the tenant within one
// period joins the same job, and a log ingested while that job runs is
// queued in the next period's job, so it lands in the next report. River's
// uniqueness is not the record of what was billed; the usage log's
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

// DefaultMaxAttempts is REPORT_MAX_ATTEMPTS's default: River attempts
// per report job.
const DefaultMaxAttempts = 5

// DefaultBatchDelay is REPORT_BATCH_DELAY's default.
const DefaultBatchDelay = time.Second

// ExpireIdempotencyKeysArgs asks a worker to drop the idempotency records'
// expired partitions and create those of the week ahead.
type ExpireIdempotencyKeysArgs struct{}

// Kind implements river.JobArgs.
func (ExpireIdempotencyKeysArgs) Kind() string { return "overage.expire_idempotency_keys" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (ExpireIdempotencyKeysArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueMaintenance}
}

// UsageLogPartitionsArgs asks a worker to create the usage log partitions
// of the months ahead and empty the request_id claims past their window
// (usagelog.Maintain).
type UsageLogPartitionsArgs struct{}

// Kind implements river.JobArgs.
func (UsageLogPartitionsArgs) Kind() string { return "overage.usage_log_partitions" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (UsageLogPartitionsArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueMaintenance}
}

// Inserter puts outbox jobs in callers' transactions.
type Inserter struct {
	client      *river.Client[pgx.Tx]
	maxAttempts int
	batchDelay  time.Duration
}

// NewInserter returns an Inserter. client may be insert-only (no queues);
// maxAttempts is REPORT_MAX_ATTEMPTS. Report jobs gather for
// DefaultBatchDelay unless WithBatchDelay says otherwise.
func NewInserter(client *river.Client[pgx.Tx], maxAttempts int) *Inserter {
	return &Inserter{client: client, maxAttempts: maxAttempts, batchDelay: DefaultBatchDelay}
}

// WithBatchDelay returns a copy of i whose report jobs gather for d
// (REPORT_BATCH_DELAY, > 0).
func (i *Inserter) WithBatchDelay(d time.Duration) *Inserter {
	c := *i
	if d > 0 {
		c.batchDelay = d
	}
	return &c
}

// report is the report job of a tenant for the batch period now falls in,
// scheduled at the period's end: a lone event waits at most one period.
func (i *Inserter) report(tenantID uuid.UUID, now time.Time) (ReportArgs, *river.InsertOpts) {
	end := now.UTC().Truncate(i.batchDelay).Add(i.batchDelay)
	opts := ReportArgs{}.InsertOpts()
	opts.MaxAttempts = i.maxAttempts
	opts.ScheduledAt = end
	return ReportArgs{TenantID: tenantID, Batch: end}, &opts
}

// InsertReportsTx queues, in the ingest transaction tx, the report of the
// usage logs it wrote, all of tenantID, whatever their number. Only the
// first transaction of the tenant's batch period inserts the River job; the
// others find the period's report_batches row and stop there, a primary-key
// probe that writes nothing. (River's unique insert would rewrite the
// period's job row in each of them.) A concurrent transaction of the tenant
// in the same period waits for the first to commit — then skips — or to
// roll back — then queues the job itself; ingest transactions of one tenant
// wait for each other on the allowance row anyway, which they take first.
func (i *Inserter) InsertReportsTx(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, usageLogIDs []uuid.UUID) error {
	if len(usageLogIDs) == 0 {
		return nil
	}
	args, opts := i.report(tenantID, time.Now())
	tag, err := tx.Exec(ctx, `INSERT INTO report_batches (tenant_id, batch) VALUES ($1, $2) ON CONFLICT DO NOTHING`, tenantID, args.Batch)
	if err != nil {
		return fmt.Errorf("queue report of %d usage logs: %w", len(usageLogIDs), err)
	}
	if tag.RowsAffected() == 0 {
		return nil // the period's job is queued
	}
	res, err := i.client.InsertTx(ctx, tx, args, opts)
	if err != nil {
		return fmt.Errorf("queue report of %d usage logs: insert report job for tenant %s: %w", len(usageLogIDs), tenantID, err)
	}
	return makeDue(ctx, tx, []*rivertype.JobInsertResult{res})
}

// ForgetBatches deletes the tenant's report_batches rows up to and
// including batch: its report job is running, so a transaction of those
// periods committing now queues a job again (River's uniqueness then
// decides), and the table stays as small as the periods in flight.
func ForgetBatches(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, tenantID uuid.UUID, batch time.Time) error {
	if _, err := db.Exec(ctx, `DELETE FROM report_batches WHERE tenant_id = $1 AND batch <= $2`, tenantID, batch); err != nil {
		return fmt.Errorf("forget report batches of tenant %s: %w", tenantID, err)
	}
	return nil
}

// InsertTenantReportTx queues the tenant's report job in tx (an operator's
// resend). A job already queued for this period is returned instead of a
// second one (UniqueSkippedAsDuplicate).
func (i *Inserter) InsertTenantReportTx(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID) (*rivertype.JobInsertResult, error) {
	args, opts := i.report(tenantID, time.Now())
	res, err := i.client.InsertTx(ctx, tx, args, opts)
	if err != nil {
		return nil, fmt.Errorf("insert report job for tenant %s: %w", tenantID, err)
	}
	if err := makeDue(ctx, tx, []*rivertype.JobInsertResult{res}); err != nil {
		return nil, err
	}
	return res, nil
}

// InsertTenantReportsTx queues the report jobs of tenants in tx with client
// (the sweep, the benchmark's seeding), skipping tenants whose job for this
// period is already queued.
func (i *Inserter) InsertTenantReportsTx(ctx context.Context, tx pgx.Tx, client *river.Client[pgx.Tx], tenants []uuid.UUID) ([]*rivertype.JobInsertResult, error) {
	return i.InsertTenantReportsAfterTx(ctx, tx, client, tenants, 0)
}

// InsertTenantReportsAfterTx is InsertTenantReportsTx for the batch period
// delay from now: the jobs run at that period's end (a report worker's
// follow-up after a transient failure, so it backs off). A job of that
// period already queued is kept.
func (i *Inserter) InsertTenantReportsAfterTx(ctx context.Context, tx pgx.Tx, client *river.Client[pgx.Tx], tenants []uuid.UUID, delay time.Duration) ([]*rivertype.JobInsertResult, error) {
	params := make([]river.InsertManyParams, len(tenants))
	now := time.Now().Add(delay)
	for n, t := range tenants {
		args, opts := i.report(t, now)
		params[n] = river.InsertManyParams{Args: args, InsertOpts: opts}
	}
	res, err := client.InsertManyTx(ctx, tx, params)
	if err != nil {
		return nil, fmt.Errorf("insert report jobs of %d tenants: %w", len(tenants), err)
	}
	return res, makeDue(ctx, tx, res)
}

// makeDue makes newly inserted report jobs available now, to be fetched
// when their scheduled_at (the end of their batch period) comes. River
// inserts a job scheduled in the future as "scheduled", and only its
// leader's scheduler, every 5 s, makes it available: that would stretch a
// one-second batch to six. An available job with a future scheduled_at is
// exactly what River's fetch is built for (it takes jobs whose scheduled_at
// has passed), so the job runs on time. One UPDATE by primary key, and only
// for the first transaction of a period: the others join its job.
func makeDue(ctx context.Context, tx pgx.Tx, res []*rivertype.JobInsertResult) error {
	var ids []int64
	for _, r := range res {
		if !r.UniqueSkippedAsDuplicate && r.Job.State == rivertype.JobStateScheduled {
			ids = append(ids, r.Job.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `UPDATE river_job SET state = 'available' WHERE id = ANY($1) AND state = 'scheduled'`, ids); err != nil {
		return fmt.Errorf("make report jobs due: %w", err)
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
