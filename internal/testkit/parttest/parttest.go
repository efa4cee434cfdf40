// Package parttest lays out the usage log partitions of a test database
// at will: the partitions of months past (which a fresh database does not
// have: its first partition spans everything before the month after next)
// or a bound a second ahead.
package parttest

import (
	"context"
	"fmt"
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

// IndexShape is one of the shapes a usage_logs partition's unique index on
// request_id has had.
type IndexShape int

const (
	// KeyIndex is the digest of tenant and request_id alone (since
	// migration 0067, usagelog.RequestKeySQL): what AddPartition makes.
	KeyIndex IndexShape = iota
	// DigestIndex is (tenant_id, md5(request_id)::uuid) (0061 to 0067).
	DigestIndex
	// RequestIDIndex is (tenant_id, request_id) (before 0061).
	RequestIDIndex
)

// Reindex gives the partition name, as AddPartition made it, the unique
// index on request_id of an earlier shape instead of its own, named as
// that shape's were: a partition made then and holding logs keeps it.
func Reindex(t testing.TB, pool *pgxpool.Pool, name string, shape IndexShape) {
	t.Helper()
	var create string
	switch shape {
	case KeyIndex:
		return
	case DigestIndex:
		create = fmt.Sprintf(`CREATE UNIQUE INDEX %[1]s%[2]s ON %[1]s (tenant_id, (%[3]s)) WHERE request_id IS NOT NULL`,
			name, usagelog.RequestDigestIndexSuffix, usagelog.RequestDigestSQL)
	case RequestIDIndex:
		create = fmt.Sprintf(`CREATE UNIQUE INDEX %[1]s%[2]s ON %[1]s (tenant_id, request_id) WHERE request_id IS NOT NULL`,
			name, usagelog.RequestIDIndexSuffix)
	}
	for _, q := range []string{`DROP INDEX ` + name + usagelog.RequestKeyIndexSuffix, create} {
		if _, err := pool.Exec(context.Background(), q); err != nil {
			t.Fatalf("reindex %s: %s: %v", name, q, err)
		}
	}
}

// UniqueIndexes lists the unique indexes of the partition part but its
// primary key, by name, with their definitions (pg_get_indexdef).
func UniqueIndexes(t testing.TB, pool *pgxpool.Pool, part string) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = $1::regclass AND i.indisunique AND NOT i.indisprimary`, part)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			t.Fatal(err)
		}
		out[name] = def
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
