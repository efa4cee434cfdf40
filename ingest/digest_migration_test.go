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
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/outbox"
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
	n0 := load.recorded(t)
	res, err := migrations.Migrate(ctx, pool, nil)
	if err != nil {
		t.Fatalf("migrate under ingest: %v", err)
	}
	during := load.recorded(t) - n0
	waitFor(t, "ingest after the migration", func() bool { return load.recorded(t) >= n0+during+300 })
	keys := load.finish(t)
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
	// A partition on the new index referees a tenant's key there.
	insert := func(tenant uuid.UUID) error {
		_, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
			VALUES ($1, 'later', '\x00', 202, '\x', $2)`, tenant, ps[0].Upper.Add(time.Hour))
		return err
	}
	if err := insert(tenant); err != nil {
		t.Fatal(err)
	}
	if err := insert(uuid.New()); err != nil {
		t.Fatalf("another tenant's same key: %v", err)
	}
	var pgErr *pgconn.PgError
	if err := insert(tenant); !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("a second record of the key in a migrated partition: %v, want a unique violation", err)
	}
}
