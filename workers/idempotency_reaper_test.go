package workers

import (
	"context"
	"log/slog"
	"testing"

	"github.com/riverqueue/river"

	"github.com/overage-billing/overage/internal/pgtest"
	"github.com/overage-billing/overage/outbox"
)

func TestIdempotencyReaperDeletesOnlyExpiredRecordsInBatches(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	// More expired rows than one batch, so the loop must run several times.
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
		SELECT gen_random_uuid(), 'k' || i, '\x00', 202, '{}', now() - interval '1 minute' FROM generate_series(1, $1) i`, reapBatchSize*2+7); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
		SELECT gen_random_uuid(), 'live' || i, '\x00', 202, '{}', now() + interval '1 hour' FROM generate_series(1, 10) i`); err != nil {
		t.Fatal(err)
	}
	w := &IdempotencyReaper{pool: pool, logger: slog.New(slog.DiscardHandler)}
	if err := w.Work(ctx, &river.Job[outbox.ExpireIdempotencyKeysArgs]{}); err != nil {
		t.Fatal(err)
	}
	var expired, live int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE expires_at <= now()), count(*) FILTER (WHERE expires_at > now()) FROM idempotency_keys`).Scan(&expired, &live); err != nil {
		t.Fatal(err)
	}
	if expired != 0 || live != 10 {
		t.Fatalf("after reaping: %d expired, %d live; want 0 and 10", expired, live)
	}
}
