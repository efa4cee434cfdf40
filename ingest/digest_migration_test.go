package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/migrations"
)

// Migration 0032 (the partitions' unique index on the digest of tenant and
// key) on a live system: a database as it was before, its first partition
// holding 100,000 records under 0052's index and written by eight clients,
// its day partitions empty under the same index. While the migration runs
// no request fails; afterwards the partition being written keeps its
// index, every empty one has the new index as its only unique index and
// referees by it, every key has exactly one record, and keys stored
// before, during and after it are replayed.
func TestTenantDigestMigrationUnderIngest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewEmptyPool(t)
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	var others []int
	for _, m := range all {
		if m.Version > 32 {
			others = append(others, m.Version)
		}
	}
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 31, others...); err != nil {
		t.Fatal(err)
	}
	ps, err := idempotency.Partitions(ctx, pool)
	if err != nil || len(ps) != 1 {
		t.Fatalf("partitions before 0032: %+v (%v), want the first one only", ps, err)
	}
	// The week's day partitions from the first one's bound, as the code
	// before 0032 made them.
	for d := ps[0].Upper; d.Before(ps[0].Upper.AddDate(0, 0, 6)); d = d.AddDate(0, 0, 1) {
		name := "idempotency_keys_" + d.Format("20060102")
		for _, q := range []string{
			fmt.Sprintf(`CREATE TABLE %s (LIKE idempotency_keys INCLUDING DEFAULTS)`, name),
			fmt.Sprintf(`CREATE UNIQUE INDEX %s_key ON %s (tenant_id, (md5(idempotency_key)::uuid))`, name, name),
			fmt.Sprintf(`ALTER TABLE idempotency_keys ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`,
				name, d.Format(time.RFC3339), d.AddDate(0, 0, 1).Format(time.RFC3339)),
		} {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	uniques := func() map[string][]string {
		rows, err := pool.Query(ctx, `SELECT i.indrelid::regclass::text, pg_get_indexdef(i.indexrelid)
			FROM pg_index i JOIN pg_inherits h ON h.inhrelid = i.indrelid
			WHERE h.inhparent = 'idempotency_keys'::regclass AND i.indisunique`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string][]string{}
		for rows.Next() {
			var part, def string
			if err := rows.Scan(&part, &def); err != nil {
				t.Fatal(err)
			}
			out[part] = append(out[part], def)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	before := uniques()

	run := migrateUnderIngest(t, pool)
	res := run.res
	if len(res.Applied) != 1 || res.Applied[0].Version != 32 {
		t.Fatalf("migrate applied %+v, want 0032 alone", res.Applied)
	}

	after := uniques()
	if len(after) != len(before)+len(res.Partitions) {
		t.Fatalf("partitions with a unique index: %d before, %d after with %v created", len(before), len(after), res.Partitions)
	}
	// idempotency.KeyDigest as pg_get_indexdef shows it.
	const newIndex = "USING btree (((md5(((tenant_id)::text || idempotency_key)))::uuid))"
	for part, defs := range after {
		if part == ps[0].Name {
			if len(defs) != 1 || defs[0] != before[part][0] {
				t.Fatalf("the partition being written has unique indexes %v, want its own %v kept", defs, before[part])
			}
			continue
		}
		if len(defs) != 1 || !strings.HasSuffix(defs[0], newIndex) {
			t.Fatalf("empty partition %s has unique indexes %v, want the digest of tenant and key alone", part, defs)
		}
	}
	run.requireEveryKeyOnceAndReplayed(t, pool)
	// A partition on the new index referees a tenant's key there.
	insert := func(tenant uuid.UUID) error {
		_, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
			VALUES ($1, 'later', '\x00', 202, '\x', $2)`, tenant, ps[0].Upper.Add(time.Hour))
		return err
	}
	if err := insert(tenantOf(t, pool)); err != nil {
		t.Fatal(err)
	}
	if err := insert(uuid.New()); err != nil {
		t.Fatalf("another tenant's same key: %v", err)
	}
	var pgErr *pgconn.PgError
	if err := insert(tenantOf(t, pool)); !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("a second record of the key in a migrated partition: %v, want a unique violation", err)
	}
}

// tenantOf is the one tenant migrateUnderIngest made.
func tenantOf(t *testing.T, pool *pgxpool.Pool) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	if err := pool.QueryRow(context.Background(), `SELECT id FROM tenants WHERE name = 'alice'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}
