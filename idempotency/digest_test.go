package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// Every partition of a new database is refereed by the digest index: a
// key is stored once per tenant and partition, other tenants' same key
// and the tenant's other keys are not held up. A partition still indexed
// on the key itself (made before 0052) is found by the same lookup.
func TestPartitionsRefereeKeysByDigestAndTheLookupFindsEitherIndex(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	var onKey []string
	rows, err := pool.Query(ctx, `SELECT i.indrelid::regclass::text FROM pg_index i JOIN pg_inherits h ON h.inhrelid = i.indrelid
		WHERE h.inhparent = 'idempotency_keys'::regclass AND i.indisunique AND pg_get_indexdef(i.indexrelid) NOT LIKE '%md5(idempotency_key)%'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		onKey = append(onKey, name)
	}
	if rows.Err() != nil || len(onKey) > 0 {
		t.Fatalf("partitions of a new database indexed on the key itself: %v (%v)", onKey, rows.Err())
	}

	alice, bob := uuid.New(), uuid.New()
	insert := func(tenant uuid.UUID, key, expires string) error {
		_, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
			VALUES ($1, $2, $3::bytea, 202, '\x', now() + $4::interval)`, tenant, key, []byte(key), expires)
		return err
	}
	for _, r := range []struct {
		tenant uuid.UUID
		key    string
	}{{alice, "k1"}, {alice, "k2"}, {bob, "k1"}} {
		if err := insert(r.tenant, r.key, "23 hours"); err != nil {
			t.Fatalf("store %s of %s: %v", r.key, r.tenant, err)
		}
	}
	var pgErr *pgconn.PgError
	if err := insert(alice, "k1", "23 hours"); !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("a second record of alice's k1 in its partition: %v, want a unique violation", err)
	}

	// A record in a partition indexed the old way.
	if err := insert(alice, "old", "1 hour"); err != nil {
		t.Fatal(err)
	}
	var part string
	if err := pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM idempotency_keys WHERE idempotency_key = 'old'`).Scan(&part); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, fmt.Sprintf(`DROP INDEX %s_key`, part))
	exec(t, pool, fmt.Sprintf(`CREATE UNIQUE INDEX %s_key ON %s (tenant_id, idempotency_key)`, part, part))

	found := map[string]string{}
	rows, err = pool.Query(ctx, idempotency.LookupSQL, alice, []string{"k1", "k2", "old", "missing"})
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		found[vals[0].(string)] = string(vals[1].([]byte))
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(found) != 3 || found["k1"] != "k1" || found["k2"] != "k2" || found["old"] != "old" {
		t.Fatalf("lookup of alice's k1, k2, old, missing found %v, want k1, k2 and old", found)
	}
	var expires time.Time
	if err := pool.QueryRow(ctx, `SELECT expires_at FROM idempotency_keys WHERE idempotency_key = 'old'`).Scan(&expires); err != nil {
		t.Fatal(err)
	}
	tag, err := pool.Exec(ctx, idempotency.DeleteExpiredSQL, alice, "old", expires)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("delete the old-index record: %v rows (%v), want 1", tag.RowsAffected(), err)
	}
}
