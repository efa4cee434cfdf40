// Package partitiontest gives a test database usage_logs partitions of
// the test's choosing: past months, or a range that ends in a few
// seconds, so retention can be tried on partitions whose whole range is
// old, with ids minted at chosen times (ID).
package partitiontest

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/usagelog"
)

// Replace drops the first partitions of usage_logs and usage_reports
// (empty in a new test database: they span every id below the months
// made at migration), creates one partition per pair of consecutive
// bounds, then the months from now on (usagelog.EnsurePartitions). It
// returns the names of the partitions of the bounds, oldest first.
func Replace(t testing.TB, pool *pgxpool.Pool, bounds ...time.Time) []string {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{`DROP TABLE usage_logs_legacy`, `DROP TABLE usage_reports_legacy`} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var names []string
	for i := 1; i < len(bounds); i++ {
		name, err := usagelog.AddPartition(ctx, pool, bounds[i-1], bounds[i])
		if err != nil {
			t.Fatalf("add partition [%s, %s): %v", bounds[i-1], bounds[i], err)
		}
		names = append(names, name)
	}
	if _, err := usagelog.EnsurePartitions(ctx, pool); err != nil {
		t.Fatalf("ensure partitions: %v", err)
	}
	return names
}

// ID is a UUIDv7 minted at t (random in its other bits), as ingest would
// have minted it then.
func ID(t time.Time) uuid.UUID {
	id := usagelog.IDFloor(t)
	if _, err := rand.Read(id[6:]); err != nil {
		panic(err)
	}
	id[6] = id[6]&0x0f | 0x70
	id[8] = id[8]&0x3f | 0x80
	return id
}
