// Package parttest lays out the usage log partitions of a test database
// at will: the partitions of months past (which a fresh database does not
// have: its first partition spans everything before the month after next)
// or a bound a second ahead.
package parttest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/usagelog"
)

// Repartition replaces the (empty) first partitions of usage_logs and
// usage_reports of a fresh test database by partitions from each bound to
// the next, and returns their usage_logs names. The first bound's row of
// usage_log_partition_bounds stays ('-infinity'), as a dropped first
// partition's would: nothing reads ids below the first bound.
func Repartition(t testing.TB, pool *pgxpool.Pool, bounds ...time.Time) []string {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`ALTER TABLE usage_logs DETACH PARTITION usage_logs_legacy`,
		`DROP TABLE usage_logs_legacy`,
		`ALTER TABLE usage_reports DETACH PARTITION usage_reports_legacy`,
		`DROP TABLE usage_reports_legacy`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("repartition: %s: %v", q, err)
		}
	}
	var names []string
	for i := 1; i < len(bounds); i++ {
		name, err := usagelog.AddPartition(ctx, pool, bounds[i-1], bounds[i])
		if err != nil {
			t.Fatalf("repartition: %v", err)
		}
		names = append(names, name)
	}
	return names
}

// Month is the first instant of t's UTC month, months later (or earlier).
func Month(t time.Time, months int) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month()+time.Month(months), 1, 0, 0, 0, 0, time.UTC)
}
