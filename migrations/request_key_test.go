package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage/internal/testkit/parttest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/usagelog"
)

// Migration 0067 moves the usage log partitions that hold no log, whether
// on 0061's index or on the one before, onto the unique index on the
// digest of tenant and request_id alone, their only unique index beside
// the primary key; a partition holding logs keeps its index. A moved
// partition referees a tenant's request_id and lets another tenant's be.
func TestRequestKeyMigrationMovesTheEmptyPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewEmptyPool(t)
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 66); err != nil {
		t.Fatal(err)
	}
	ps, err := usagelog.Partitions(ctx, pool)
	if err != nil || len(ps) != 1 {
		t.Fatalf("partitions after 0066: %+v (%v), want the first one", ps, err)
	}
	// Two months after the first partition, empty: one as the code from
	// 0061 made them, one on the request_id itself (made before 0061 and
	// empty since); a log in the first partition (0061's index).
	var ahead []string
	for m, index := range []string{"(tenant_id, (md5(request_id)::uuid))", "(tenant_id, request_id)"} {
		lower, upper := ps[0].Upper.AddDate(0, m, 0), ps[0].Upper.AddDate(0, m+1, 0)
		name := "usage_logs_p" + lower.Format("200601")
		for _, q := range []string{
			fmt.Sprintf(`CREATE TABLE %s (LIKE usage_logs INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION) WITH (fillfactor = 100)`, name),
			fmt.Sprintf(`CREATE UNIQUE INDEX %[1]s_old ON %[1]s %[2]s WHERE request_id IS NOT NULL`, name, index),
			fmt.Sprintf(`ALTER TABLE usage_logs ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`, name, usagelog.IDFloor(lower), usagelog.IDFloor(upper)),
		} {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		ahead = append(ahead, name)
	}
	insert := func(id, tenant uuid.UUID, rid string) error {
		_, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
				period_start, overage_input_tokens, overage_output_tokens, billing_status)
			VALUES ($1, $2, $3, now(), 'u', 'm', 1, 1, date_trunc('month', now(), 'UTC'), 0, 0, 'not_billable')`, id, tenant, rid)
		return err
	}
	tenant := uuid.New()
	if err := insert(uuid.Must(uuid.NewV7()), tenant, "before"); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 67); err != nil {
		t.Fatal(err)
	}
	if got := parttest.UniqueIndexes(t, pool, ps[0].Name); len(got) != 1 || got[ps[0].Name+"_request_digest"] == "" {
		t.Errorf("the partition holding a log has unique indexes %v; want its own %s_request_digest", got, ps[0].Name)
	}
	const def = " USING btree (((md5(((tenant_id)::text || request_id)))::uuid)) WHERE (request_id IS NOT NULL)"
	for _, name := range ahead {
		if got := parttest.UniqueIndexes(t, pool, name); len(got) != 1 || !strings.HasSuffix(got[name+"_request_key"], def) {
			t.Errorf("empty partition %s has unique indexes %v; want %s_request_key alone,%s", name, got, name, def)
		}
	}
	// The moved partition referees one request_id of the tenant, and lets
	// another tenant's be.
	at := usagelog.IDFloor(ps[0].Upper.Add(time.Hour))
	next := func() uuid.UUID { at[15]++; return at }
	if err := insert(next(), tenant, "later"); err != nil {
		t.Fatal(err)
	}
	if err := insert(next(), uuid.New(), "later"); err != nil {
		t.Fatalf("another tenant's request_id in a moved partition: %v", err)
	}
	var pgErr *pgconn.PgError
	if err := insert(next(), tenant, "later"); !errors.As(err, &pgErr) || pgErr.Code != "23505" || pgErr.ConstraintName != ahead[0]+"_request_key" {
		t.Fatalf("a second log of the request_id in a moved partition: %v, want the violation of %s_request_key", err, ahead[0])
	}
}
