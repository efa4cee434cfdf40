package ingest_test

import (
	"context"
	"testing"

	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/migrations"
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
	run := migrateUnderIngest(t, pool)
	res := run.res

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
	run.requireEveryKeyOnceAndReplayed(t, pool)
}
