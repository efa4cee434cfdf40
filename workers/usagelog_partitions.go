package workers

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/usagelog"
)

// UsageLogPartitioner keeps the usage log and report partitions of the
// months ahead and empties the request_id claims once their partition
// bound is past (usagelog.Maintain), every REAP_INTERVAL.
type UsageLogPartitioner struct {
	river.WorkerDefaults[outbox.UsageLogPartitionsArgs]
	pool   *pgxpool.Pool
	logger *slog.Logger
}

// Work implements river.Worker.
func (w *UsageLogPartitioner) Work(ctx context.Context, _ *river.Job[outbox.UsageLogPartitionsArgs]) error {
	if err := usagelog.Maintain(ctx, w.pool, w.logger); err != nil {
		return fmt.Errorf("usage log partitions: %w", err)
	}
	return nil
}
