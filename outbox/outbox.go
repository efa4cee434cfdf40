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
	"sync"
	"time"

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

// DefaultBatchDelay is REPORT_BATCH_DELAY's default.
const DefaultBatchDelay = time.Second

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
	batchDelay  time.Duration
	queued      *queuedReports
}

// queuedReports remembers, per tenant, the River unique key of the report
// job last queued by this process, and its batch period.
type queuedReports struct {
	mu sync.Mutex
	m  map[uuid.UUID]queuedReport
}

type queuedReport struct {
	batch     time.Time
	uniqueKey []byte
}

func (q *queuedReports) key(tenantID uuid.UUID, batch time.Time) []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	if r, ok := q.m[tenantID]; ok && r.batch.Equal(batch) {
		return r.uniqueKey
	}
	return nil
}

func (q *queuedReports) remember(tenantID uuid.UUID, batch time.Time, uniqueKey []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.m[tenantID] = queuedReport{batch: batch, uniqueKey: uniqueKey}
}

// NewInserter returns an Inserter. client may be insert-only (no queues);
// maxAttempts is REPORT_MAX_ATTEMPTS. Report jobs gather for
// DefaultBatchDelay unless WithBatchDelay says otherwise.
func NewInserter(client *river.Client[pgx.Tx], maxAttempts int) *Inserter {
	return &Inserter{client: client, maxAttempts: maxAttempts, batchDelay: DefaultBatchDelay,
		queued: &queuedReports{m: map[uuid.UUID]queuedReport{}}}
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
// usage logs it wrote, all of tenantID. It costs one statement per
// transaction, whatever the number of logs.
//
// When the tenant's job for this period is already committed, it is
// joined by reading it, not by River's unique insert: that insert updates
// the existing job row (ON CONFLICT DO UPDATE, to return it), so every
// ingest transaction of a tenant would hold that row's lock until its
// commit and wait for the previous one's — one tenant's events committing
// one at a time again, measured at a third of the rate. The read finds the
// job through River's own unique index, under River's own condition for a
// duplicate, so it skips exactly the inserts River would have skipped; the
// first transactions of a period, before the job is committed, still go
// through River and wait for each other.
func (i *Inserter) InsertReportsTx(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, usageLogIDs []uuid.UUID) error {
	if len(usageLogIDs) == 0 {
		return nil
	}
	now := time.Now()
	args, _ := i.report(tenantID, now)
	if key := i.queued.key(tenantID, args.Batch); key != nil {
		var queued bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM river_job WHERE unique_key = $1
			AND unique_states IS NOT NULL AND river_job_state_in_bitmask(unique_states, state))`, key).Scan(&queued); err != nil {
			return fmt.Errorf("look up the report job of %d usage logs: %w", len(usageLogIDs), err)
		}
		if queued {
			return nil
		}
	}
	res, err := i.insertTenantReportTx(ctx, tx, tenantID, now)
	if err != nil {
		return fmt.Errorf("queue report of %d usage logs: %w", len(usageLogIDs), err)
	}
	if res.Job.UniqueKey != nil {
		i.queued.remember(tenantID, args.Batch, res.Job.UniqueKey)
	}
	return nil
}

// InsertTenantReportTx queues the tenant's report job in tx (an operator's
// resend). A job already queued for this period is returned instead of a
// second one (UniqueSkippedAsDuplicate).
func (i *Inserter) InsertTenantReportTx(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID) (*rivertype.JobInsertResult, error) {
	return i.insertTenantReportTx(ctx, tx, tenantID, time.Now())
}

func (i *Inserter) insertTenantReportTx(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, now time.Time) (*rivertype.JobInsertResult, error) {
	args, opts := i.report(tenantID, now)
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
	params := make([]river.InsertManyParams, len(tenants))
	now := time.Now()
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
