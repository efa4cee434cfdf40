package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/retention"
)

// DefaultRetentionInterval is how often `overage work` runs retention.
const DefaultRetentionInterval = 24 * time.Hour

// UsageLogRetention runs retention (retention.Run: the usage log
// partitions past USAGE_LOG_RETENTION, final and closed, rolled up and
// dropped; those kept whose month is over and billed, packed) and logs
// what it did.
type UsageLogRetention struct {
	river.WorkerDefaults[outbox.UsageLogRetentionArgs]
	pool   *pgxpool.Pool
	cfg    retention.Config
	logger *slog.Logger
}

// Timeout implements river.Worker: a roll-up reads a month of logs, far
// longer than a report job's REPORT_JOB_TIMEOUT; it is bounded by the
// database, not by a deadline that would cut it (and roll it back) every
// time. If River's rescuer runs it again meanwhile, the second run finds
// the first holding the retention lock and ends.
func (w *UsageLogRetention) Timeout(*river.Job[outbox.UsageLogRetentionArgs]) time.Duration {
	return -1
}

// Work implements river.Worker.
func (w *UsageLogRetention) Work(ctx context.Context, _ *river.Job[outbox.UsageLogRetentionArgs]) error {
	start := time.Now()
	res, err := retention.Run(ctx, w.pool, w.cfg, false)
	if errors.Is(err, retention.ErrBusy) {
		w.logger.InfoContext(ctx, "usage log retention: another run is in progress")
		return nil
	}
	if err != nil {
		return fmt.Errorf("usage log retention: %w", err)
	}
	dropped, kept, packed, first := res.Summary()
	w.logger.InfoContext(ctx, "usage log retention", "dropped", dropped, "kept", kept, "packed", packed, "first_kept", first,
		"retention", res.Retention, "rolled_up_before", res.WatermarkAt, "took", time.Since(start))
	return nil
}

// retentionJob runs UsageLogRetention every interval and at start, once
// per interval however many leaders come and go.
func retentionJob(interval time.Duration) *river.PeriodicJob {
	return river.NewPeriodicJob(river.PeriodicInterval(interval),
		func() (river.JobArgs, *river.InsertOpts) {
			return outbox.UsageLogRetentionArgs{}, &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: interval}}
		},
		&river.PeriodicJobOpts{ID: "usage_log_retention", RunOnStart: true})
}
