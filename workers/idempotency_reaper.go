package workers

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/overage-billing/overage/outbox"
)

// reapBatchSize bounds each DELETE, so expiring a day's worth of keys never
// holds locks on, or bloats WAL with, millions of rows in one statement.
const reapBatchSize = 5000

// IdempotencyReaper deletes expired idempotency records, batch by batch,
// by the database clock.
type IdempotencyReaper struct {
	river.WorkerDefaults[outbox.ExpireIdempotencyKeysArgs]
	pool   *pgxpool.Pool
	logger *slog.Logger
}

// Work implements river.Worker.
func (w *IdempotencyReaper) Work(ctx context.Context, _ *river.Job[outbox.ExpireIdempotencyKeysArgs]) error {
	total := int64(0)
	for {
		tag, err := w.pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE (tenant_id, idempotency_key) IN (
			SELECT tenant_id, idempotency_key FROM idempotency_keys
			WHERE expires_at <= now() LIMIT $1)`, reapBatchSize)
		if err != nil {
			return fmt.Errorf("delete expired idempotency records: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < reapBatchSize {
			break
		}
	}
	if total > 0 {
		w.logger.InfoContext(ctx, "expired idempotency records deleted", "count", total)
	}
	return nil
}
