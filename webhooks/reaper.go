package webhooks

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/webhooks/partitions"
)

// Retention is how long webhook events are kept. Stripe redelivers an
// event for at most three days, so a month dropped after a year cannot let
// a redelivery be applied twice.
const Retention = 365 * 24 * time.Hour

// Reaper keeps the webhook events' partitions (partitions.Maintain): it
// drops, whole, the months whose whole range is older than Retention by
// the database clock and whose every event is processed, and creates the
// months ahead. It also requeues processing of events left without a job
// (Requeue). An unprocessed event is never dropped: it is still owed its
// effect, so its month is kept (and logged, since a year-old backlog
// means the processor is stuck). Nothing is deleted row by row.
type Reaper struct {
	river.WorkerDefaults[outbox.ExpireWebhookEventsArgs]
	pool      *pgxpool.Pool
	logger    *slog.Logger
	retention time.Duration
}

// NewReaper returns the retention worker (queue maintenance).
func NewReaper(pool *pgxpool.Pool, logger *slog.Logger) *Reaper {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Reaper{pool: pool, logger: logger, retention: Retention}
}

// Work implements river.Worker.
func (w *Reaper) Work(ctx context.Context, _ *river.Job[outbox.ExpireWebhookEventsArgs]) error {
	if err := partitions.Maintain(ctx, w.pool, w.retention, w.logger); err != nil {
		return fmt.Errorf("webhook event partitions: %w", err)
	}
	rc, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	if err := w.Requeue(ctx, rc); err != nil {
		return err
	}
	// Counted by event, not by partition: an unprocessed event past
	// retention in a month not yet wholly past (or in the first
	// partition, which spans months) is reported too.
	var stuck int64
	if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM stripe_webhook_events
		WHERE processed_at IS NULL AND received_at < now() - make_interval(secs => $1)`, w.retention.Seconds()).Scan(&stuck); err != nil {
		return fmt.Errorf("count unprocessed expired webhook events: %w", err)
	}
	if stuck > 0 {
		w.logger.ErrorContext(ctx, "webhook events past retention were never processed; kept", "count", stuck)
	}
	return nil
}

// Requeue queues a processing job for the newest event left unprocessed
// for over a minute (a job that drains everything before it), in case an
// event's job was lost and neither a redelivery nor a later event has
// queued one. River skips it while an equal job is live.
func (w *Reaper) Requeue(ctx context.Context, rc *river.Client[pgx.Tx]) error {
	var seq *int64
	if err := w.pool.QueryRow(ctx, `SELECT max(seq) FROM stripe_webhook_events
		WHERE processed_at IS NULL AND received_at < now() - interval '1 minute'`).Scan(&seq); err != nil {
		return fmt.Errorf("find unprocessed webhook events: %w", err)
	}
	if seq == nil {
		return nil
	}
	if _, err := rc.Insert(ctx, outbox.ProcessWebhookArgs{Seq: *seq}, nil); err != nil {
		return fmt.Errorf("requeue webhook events up to %d: %w", *seq, err)
	}
	return nil
}
