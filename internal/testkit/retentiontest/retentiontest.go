// Package retentiontest gives retention's tests usage log partitions
// whose whole range is old (or ends in a few seconds), with the months
// from now on made as usual, and ids minted at chosen times (ID).
package retentiontest

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/internal/testkit/parttest"
	"github.com/overage-billing/overage/usagelog"
)

// Replace lays out the partitions from each bound to the next
// (parttest.Repartition), then the months from now on
// (usagelog.EnsurePartitions), and returns the names of the first ones,
// oldest first. The last bound must be the first instant of a month, or
// EnsurePartitions leaves the rest of that month without a partition.
func Replace(t testing.TB, pool *pgxpool.Pool, bounds ...time.Time) []string {
	t.Helper()
	names := parttest.Repartition(t, pool, bounds...)
	if _, err := usagelog.EnsurePartitions(context.Background(), pool); err != nil {
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
