package ingest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/outbox"
)

// Migrations 0025-0027 move the idempotency records to a partitioned table
// on a live system: while ingest records single events from eight clients,
// the migration runs; no request fails, every key written before, during
// and after it has exactly one record and is replayed, and a key stored
// before it (in what becomes the first partition) still answers.
func TestPartitioningMigrationUnderIngest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewEmptyPool(t)
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 24, 30, 31, 38); err != nil {
		t.Fatal(err)
	}
	tenant := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id) VALUES ($1, 'alice', 'cus_alice')`, tenant); err != nil {
		t.Fatal(err)
	}
	const seeded = 100_000
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
		SELECT $1, 'old-' || g, convert_to('old-' || g, 'UTF8'), 202, '\x7b7d', now() + interval '23 hours'
		FROM generate_series(1, $2::int) g`, tenant, seeded); err != nil {
		t.Fatal(err)
	}
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc := ingest.NewService(pool, outbox.NewInserter(rc, 5))
	record := func(key string) (*ingest.Outcome, error) {
		ev := &ingest.Event{UserID: "u", ModelID: "m", InputTokens: 1, OutputTokens: 1, Timestamp: time.Now().UTC().Truncate(time.Microsecond)}
		return svc.Record(ctx, ingest.RecordParams{TenantID: tenant, Key: key, Fingerprint: []byte(key), Event: ev})
	}

	load := startEventLoad(8, "live", 30*time.Second, record)
	waitFor(t, "ingest before the migration", func() bool { return load.recorded(t) >= 300 })
	before := load.recorded(t)
	res, err := migrations.Migrate(ctx, pool, nil)
	if err != nil {
		t.Fatalf("migrate under ingest: %v", err)
	}
	during := load.recorded(t) - before
	waitFor(t, "ingest after the migration", func() bool { return load.recorded(t) >= before+during+300 })
	keys := load.finish(t)

	// Later migrations (0030 on) apply too; these three are the move.
	partitioning := 0
	for _, m := range res.Applied {
		if m.Version >= 25 && m.Version <= 27 {
			partitioning++
		}
	}
	if partitioning != 3 || len(res.Partitions) == 0 {
		t.Fatalf("migrate applied %d files and created partitions %v; want 0025-0027 and the week's days", len(res.Applied), res.Partitions)
	}
	var kind string
	if err := pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE relname = 'idempotency_keys'`).Scan(&kind); err != nil || kind != "p" {
		t.Fatalf("idempotency_keys is of kind %q (%v), want a partitioned table", kind, err)
	}
	ps, err := idempotency.Partitions(ctx, pool)
	if err != nil || len(ps) < 2 || ps[0].Name != "idempotency_keys_legacy" || ps[0].Lower != nil {
		t.Fatalf("partitions %+v (%v): want the table before the migration first", ps, err)
	}
	var records, distinct, logs int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT idempotency_key) FROM idempotency_keys WHERE idempotency_key LIKE 'live-%'`).Scan(&records, &distinct); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs`).Scan(&logs); err != nil {
		t.Fatal(err)
	}
	if records != len(keys) || distinct != len(keys) || logs != len(keys) {
		t.Fatalf("%d requests recorded: %d records (%d keys), %d usage logs; want one of each a request", len(keys), records, distinct, logs)
	}
	t.Logf("%d events recorded, %d of them while the migration ran", len(keys), during)
	for _, key := range []string{keys[0], keys[len(keys)/2], keys[len(keys)-1], "old-1", fmt.Sprintf("old-%d", seeded)} {
		out, err := record(key)
		if err != nil || out.Kind != ingest.OutcomeReplay {
			t.Fatalf("key %s after the migration: %+v, %v; want its stored answer replayed", key, out, err)
		}
	}
}
