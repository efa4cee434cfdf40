package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// tenantDigestIndex is how pg_get_indexdef shows the partitions' unique
// index since 0032 (idempotency.KeyDigest).
const tenantDigestIndex = `%USING btree (((md5(((tenant_id)::text || idempotency_key)))::uuid))`

// Every partition of a new database is refereed by the digest of tenant
// and key, its only unique index: a key is stored once per tenant and
// partition, other tenants' same key and the tenant's other keys are not
// held up. Partitions still indexed as 0052 made them (the tenant beside
// the key's digest) or on the key itself (before 0052) are found by the
// same lookup, and their expired records deleted by the same statement.
func TestPartitionsRefereeKeysByDigestAndTheLookupFindsEveryIndex(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	if n := count(t, pool, `SELECT count(*) FROM pg_index i JOIN pg_inherits h ON h.inhrelid = i.indrelid
		WHERE h.inhparent = 'idempotency_keys'::regclass AND i.indisunique AND pg_get_indexdef(i.indexrelid) NOT LIKE $1`, tenantDigestIndex); n > 0 {
		t.Fatalf("%d partitions of a new database with a unique index other than the digest of tenant and key", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency_keys'::regclass`); n < 2 {
		t.Fatalf("%d partitions", n)
	}

	today := dbToday(t, pool)
	makeDayPartitions(t, pool, today)
	createDay(t, pool, today.AddDate(0, 0, -1))
	exec(t, pool, fmt.Sprintf(`CREATE UNIQUE INDEX %[1]s_key ON %[1]s ((md5(tenant_id::text || idempotency_key)::uuid))`, dayName(today.AddDate(0, 0, -1))))

	alice, bob := uuid.New(), uuid.New()
	insert := func(tenant uuid.UUID, key string, expires time.Time) error {
		_, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
			VALUES ($1, $2, $3::bytea, 202, '\x', $4)`, tenant, key, []byte(key), expires)
		return err
	}
	// One record a partition: yesterday's (expired), today's first
	// instant (expired), tomorrow's first hour (live, within the lookup's
	// horizon whatever the time of day).
	at := map[string]time.Time{
		"raw":  today.Add(-12 * time.Hour),
		"0052": today,
		"new":  today.Add(25 * time.Hour),
	}
	for key, exp := range at {
		if err := insert(alice, key, exp); err != nil {
			t.Fatalf("store %s: %v", key, err)
		}
	}
	// Yesterday's partition indexed on the key itself, today's as 0052
	// made them; tomorrow's keeps the new index.
	reindex := func(day time.Time, cols string) {
		name := dayName(day)
		exec(t, pool, fmt.Sprintf(`DROP INDEX %s_key`, name))
		exec(t, pool, fmt.Sprintf(`CREATE UNIQUE INDEX %s_key ON %s (%s)`, name, name, cols))
	}
	reindex(today.AddDate(0, 0, -1), "tenant_id, idempotency_key")
	reindex(today, "tenant_id, (md5(idempotency_key)::uuid)")

	var pgErr *pgconn.PgError
	for key, exp := range at {
		if err := insert(alice, key, exp.Add(time.Minute)); !errors.As(err, &pgErr) || pgErr.Code != "23505" {
			t.Fatalf("a second record of alice's %s in its partition: %v, want a unique violation", key, err)
		}
		if err := insert(bob, key, exp.Add(time.Minute)); err != nil {
			t.Fatalf("bob's %s beside alice's: %v", key, err)
		}
		if err := insert(alice, key+"-other", exp.Add(time.Minute)); err != nil {
			t.Fatalf("alice's other key beside %s: %v", key, err)
		}
	}

	found := lookup(t, pool, alice, "raw", "0052", "new", "missing")
	want := map[string]bool{"raw": true, "0052": true, "new": false} // key: expired
	if len(found) != len(want) {
		t.Fatalf("lookup of alice's raw, 0052, new, missing found %v, want %v", found, want)
	}
	for key, expired := range want {
		if got, ok := found[key]; !ok || got != expired {
			t.Fatalf("lookup of alice's %s: found %v expired %v, want expired %v", key, ok, got, expired)
		}
	}
	for key, exp := range at {
		tag, err := pool.Exec(ctx, idempotency.DeleteExpiredSQL, alice, key, exp)
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("delete alice's %s: %v rows (%v), want 1", key, tag.RowsAffected(), err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1`, bob); n != 3 {
		t.Fatalf("bob has %d records after alice's were deleted, want 3", n)
	}
}

// lookup runs LookupSQL and returns each key found with whether its record
// has expired.
func lookup(t *testing.T, pool *pgxpool.Pool, tenant uuid.UUID, keys ...string) map[string]bool {
	t.Helper()
	rows, err := pool.Query(context.Background(), idempotency.LookupSQL, tenant, keys)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	found := map[string]bool{}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		if string(vals[1].([]byte)) != vals[0].(string) {
			t.Fatalf("key %v answered with %q", vals[0], vals[1])
		}
		found[vals[0].(string)] = vals[6].(bool)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return found
}
