package workers

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/webhooks"
)

// AddWebhookWorkers registers the webhooks package's processor, on pool,
// and reaper, a maintenance job, on maint. Every River worker of `overage
// work` is registered here, in workers; webhooks only does their work.
func AddWebhookWorkers(ws *river.Workers, pool, maint *pgxpool.Pool, logger *slog.Logger) error {
	if err := river.AddWorkerSafely(ws, webhooks.NewProcessor(pool, logger)); err != nil {
		return fmt.Errorf("add webhook processor: %w", err)
	}
	if err := river.AddWorkerSafely(ws, webhooks.NewReaper(maint, logger)); err != nil {
		return fmt.Errorf("add webhook reaper: %w", err)
	}
	return nil
}

// WebhooksQueue is the webhooks queue's configuration: one worker, so
// Stripe events are applied one at a time, in order.
func WebhooksQueue() river.QueueConfig { return river.QueueConfig{MaxWorkers: 1} }

// WebhookRetentionJob runs the webhook reaper every interval (and on
// start).
func WebhookRetentionJob(interval time.Duration) *river.PeriodicJob {
	return river.NewPeriodicJob(river.PeriodicInterval(interval),
		func() (river.JobArgs, *river.InsertOpts) { return outbox.ExpireWebhookEventsArgs{}, nil },
		&river.PeriodicJobOpts{ID: "expire_webhook_events", RunOnStart: true})
}
