package usagelog_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage/internal/testkit/parttest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/usagelog"
)

// requestKeyIndexDef is the definition pg_get_indexdef shows of the
// unique index on request_id since 0067, after its name and table.
const requestKeyIndexDef = "USING btree (((md5(((tenant_id)::text || request_id)))::uuid)) WHERE (request_id IS NOT NULL)"

// Every partition AddPartition makes (and a fresh database's first one,
// which migration 0067 moved) has one unique index beside its primary
// key, `<partition>_request_key` on the digest of tenant and request_id
// alone; it referees a tenant's request_id and lets another tenant's
// same request_id be.
func TestAddPartitionIndexesTheDigestOfTenantAndRequestID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	created, err := usagelog.EnsurePartitions(ctx, pool)
	if err != nil || len(created) == 0 {
		t.Fatalf("created %v (%v); want the months ahead", created, err)
	}
	for _, part := range append([]string{"usage_logs_legacy"}, created...) {
		got := parttest.UniqueIndexes(t, pool, part)
		def, ok := got[part+usagelog.RequestKeyIndexSuffix]
		if len(got) != 1 || !ok || !strings.HasSuffix(def, " "+requestKeyIndexDef) {
			t.Errorf("partition %s has unique indexes %v; want %s%s alone, %s", part, got, part, usagelog.RequestKeyIndexSuffix, requestKeyIndexDef)
		}
	}
	// The newest partition (a month ahead) referees.
	ps, err := usagelog.Partitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	last := ps[len(ps)-1]
	at := last.Lower.Add(time.Hour)
	tenant, other := uuid.New(), uuid.New()
	if _, err := pool.Exec(ctx, insertLogSQL, tenant, idAt(at), "r"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, insertLogSQL, other, idAt(at), "r"); err != nil {
		t.Fatalf("another tenant's same request_id: %v", err)
	}
	var pgErr *pgconn.PgError
	if _, err := pool.Exec(ctx, insertLogSQL, tenant, idAt(at), "r"); !errors.As(err, &pgErr) || pgErr.Code != "23505" ||
		pgErr.ConstraintName != last.Name+usagelog.RequestKeyIndexSuffix {
		t.Fatalf("the tenant's request_id again: %v; want the violation of %s%s", err, last.Name, usagelog.RequestKeyIndexSuffix)
	}
}

// One lookup finds the logs of request_ids in partitions of every index
// shape together, each once, and a request_id another tenant recorded in
// any of them answers for no one else.
func TestLookupByRequestIDAcrossIndexShapes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	now := time.Now().UTC()
	names := parttest.Repartition(t, pool, parttest.Month(now, -2), parttest.Month(now, -1), parttest.Month(now, 0), parttest.Month(now, 2))
	parttest.Reindex(t, pool, names[0], parttest.RequestIDIndex)
	parttest.Reindex(t, pool, names[1], parttest.DigestIndex)
	tenant, other := uuid.New(), uuid.New()
	rids := []string{"keyed", "digested", "new"}
	for i, rid := range rids {
		at := parttest.Month(now, i-2).Add(time.Hour)
		if _, err := pool.Exec(ctx, insertLogSQL, tenant, idAt(at), rid); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, insertLogSQL, other, idAt(at), "theirs-"+rid); err != nil {
			t.Fatal(err)
		}
	}
	found := func(tenant uuid.UUID, rids []string) []string {
		t.Helper()
		rows, err := pool.Query(ctx, usagelog.LogsByRequestIDSQL, tenant, rids)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			v, err := r.Values() // LogColumns: id, tenant_id, request_id, …
			if err != nil {
				return "", err
			}
			return v[2].(string), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := found(tenant, append(rids, "missing")); !slices.Equal(got, rids) {
		t.Errorf("the lookup of %v found %v; want each once, from partitions %v", rids, got, names)
	}
	if got := found(tenant, []string{"theirs-keyed", "theirs-digested", "theirs-new"}); len(got) != 0 {
		t.Errorf("the other tenant's request_ids answered for the tenant: %v", got)
	}
}
