package workers

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/outbox"
)

// IdempotencyReaper keeps the idempotency records' partitions: it drops
// those whose records have all expired, whole, and creates those of the
// week ahead (idempotency.Maintain). Nothing is deleted row by row.
type IdempotencyReaper struct {
	river.WorkerDefaults[outbox.ExpireIdempotencyKeysArgs]
	pool   *pgxpool.Pool
	logger *slog.Logger
}

// Work implements river.Worker.
func (w *IdempotencyReaper) Work(ctx context.Context, _ *river.Job[outbox.ExpireIdempotencyKeysArgs]) error {
	if err := idempotency.Maintain(ctx, w.pool, w.logger); err != nil {
		return fmt.Errorf("idempotency record partitions: %w", err)
	}
	return nil
}
