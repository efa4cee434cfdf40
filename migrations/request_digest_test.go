package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/usagelog"
)

// Migration 0061 moves the usage log partitions that hold no log onto the
// unique index on (tenant_id, md5(request_id)::uuid), its only unique
// index beside the primary key, with fillfactor 100; a partition holding
// logs keeps its index on (tenant_id, request_id) and its fillfactor. A
// moved partition referees a tenant's request_id by its digest.
func TestRequestDigestMigrationMovesTheEmptyPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewEmptyPool(t)
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 60); err != nil {
		t.Fatal(err)
	}
	ps, err := usagelog.Partitions(ctx, pool)
	if err != nil || len(ps) != 1 {
		t.Fatalf("partitions after 0060: %+v (%v), want the first one", ps, err)
	}
	// Two months after the first partition, as the code before 0061 made
	// them, and a log in the first one.
	var ahead []string
	for m := range 2 {
		lower, upper := ps[0].Upper.AddDate(0, m, 0), ps[0].Upper.AddDate(0, m+1, 0)
		name := "usage_logs_p" + lower.Format("200601")
		for _, q := range []string{
			fmt.Sprintf(`CREATE TABLE %s (LIKE usage_logs INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION) WITH (fillfactor = 80)`, name),
			fmt.Sprintf(`CREATE UNIQUE INDEX %[1]s_request_id ON %[1]s (tenant_id, request_id) WHERE request_id IS NOT NULL`, name),
			fmt.Sprintf(`ALTER TABLE usage_logs ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`, name, usagelog.IDFloor(lower), usagelog.IDFloor(upper)),
		} {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		ahead = append(ahead, name)
	}
	tenant := uuid.New()
	insert := func(id uuid.UUID, rid string) error {
		_, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
				period_start, overage_input_tokens, overage_output_tokens, billing_status)
			VALUES ($1, $2, $3, now(), 'u', 'm', 1, 1, date_trunc('month', now(), 'UTC'), 0, 0, 'not_billable')`, id, tenant, rid)
		return err
	}
	if err := insert(uuid.Must(uuid.NewV7()), "before"); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 61); err != nil {
		t.Fatal(err)
	}
	uniques := func(part string) (names []string, options []string) {
		rows, err := pool.Query(ctx, `SELECT i.indexrelid::regclass::text FROM pg_index i
			WHERE i.indrelid = $1::regclass AND i.indisunique AND NOT i.indisprimary ORDER BY 1`, part)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			names = append(names, n)
		}
		if err := pool.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass`, part).Scan(&options); err != nil {
			t.Fatal(err)
		}
		return names, options
	}
	if got, opts := uniques(ps[0].Name); !slices.Equal(got, []string{ps[0].Name + "_request_id"}) || slices.Contains(opts, "fillfactor=100") {
		t.Errorf("the partition holding a log has unique indexes %v, options %v; want its own index on request_id, its fillfactor", got, opts)
	}
	for _, name := range ahead {
		if got, opts := uniques(name); !slices.Equal(got, []string{name + "_request_digest"}) || !slices.Contains(opts, "fillfactor=100") {
			t.Errorf("empty partition %s has unique indexes %v, options %v; want %s_request_digest alone, fillfactor=100", name, got, opts, name)
		}
	}
	// The moved partition referees one request_id of the tenant.
	at := usagelog.IDFloor(ps[0].Upper.Add(time.Hour))
	next := func() uuid.UUID { at[15]++; return at }
	if err := insert(next(), "later"); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if err := insert(next(), "later"); !errors.As(err, &pgErr) || pgErr.Code != "23505" || pgErr.ConstraintName != ahead[0]+"_request_digest" {
		t.Fatalf("a second log of the request_id in a moved partition: %v, want the violation of %s_request_digest", err, ahead[0])
	}
}
