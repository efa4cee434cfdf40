package usagelog

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// The billing statements that write logs by id are planned on the
// partitions of their ids only, as their code runs them (custom plans,
// planSettingsSQL): the planner prunes by the ids' bounds (IDBounds),
// which it cannot do by the join on the ids themselves (closeMembersSQL's
// id = ANY($1) needs none: it prunes by itself). The same
// statements given bounds that span every id are planned on every
// partition, so the check can fail.
func TestBillingWritesArePlannedOnTheirIdsPartitionsOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	if _, err := EnsurePartitions(ctx, pool); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'usage_logs'::regclass`)
	if err != nil {
		t.Fatal(err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(all) < 2 {
		t.Fatalf("usage_logs has partitions %v; the test needs two or more", all)
	}
	sort.Strings(all)
	// Two ids of the first partition (every id below the first month's).
	ids := []uuid.UUID{uuid.MustParse(planLog(7)), uuid.MustParse(planLog(3))}
	lo, hi := IDBounds(ids)
	if lo != ids[1] || hi != ids[0] {
		t.Fatalf("IDBounds(%v) = %v, %v", ids, lo, hi)
	}
	if l, h := IDBounds(nil); l != uuid.Nil || h != uuid.Nil {
		t.Fatalf("IDBounds(nil) = %v, %v", l, h)
	}
	max := uuid.MustParse("ffffffff-ffff-ffff-ffff-ffffffffffff")
	nulls := []*uuid.UUID{nil, nil}
	statements := []struct {
		name string
		sql  string
		args func(lo, hi uuid.UUID) []any
	}{
		{"form membership", formMembershipSQL, func(lo, hi uuid.UUID) []any {
			return []any{ids, nulls, nulls, []*uuid.UUID{}, []int32{0, 0}, []int32{0, 0}, []string{"usage", "usage"}, lo, hi}
		}},
		{"accept members (pending)", acceptMembersSQL(`u.billing_status = 'pending'`), func(lo, hi uuid.UUID) []any {
			return []any{ids, []bool{true, true}, []bool{true, true}, []*string{nil, nil}, lo, hi}
		}},
		{"accept members (under review)", acceptMembersSQL(`u.billing_status <> 'pending'`), func(lo, hi uuid.UUID) []any {
			return []any{ids, []bool{true, true}, []bool{true, true}, []*string{nil, nil}, lo, hi}
		}},
	}
	for _, s := range statements {
		for _, c := range []struct {
			lo, hi uuid.UUID
			want   []string
		}{{lo, hi, []string{"usage_logs_legacy"}}, {uuid.Nil, max, all}} {
			got := plannedPartitions(t, pool, s.sql, s.args(c.lo, c.hi))
			if !slices.Equal(got, c.want) {
				t.Errorf("%s, ids between %s and %s: planned on %v, want %v", s.name, c.lo, c.hi, got, c.want)
			}
		}
	}
}

// plannedPartitions is the usage_logs partitions the plan of sql with
// args updates, sorted, planned as the report store plans (planSettingsSQL).
func plannedPartitions(t *testing.T, pool *pgxpool.Pool, sql string, args []any) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := planSettings(ctx, tx); err != nil {
		t.Fatal(err)
	}
	var raw []byte
	if err := tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+sql, args...).Scan(&raw); err != nil {
		t.Fatalf("explain: %v", err)
	}
	var plan []struct {
		Plan struct {
			Targets []struct {
				Relation string `json:"Relation Name"`
			} `json:"Target Tables"`
		}
	}
	if err := json.Unmarshal(raw, &plan); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range plan[0].Plan.Targets {
		out = append(out, r.Relation)
	}
	sort.Strings(out)
	return out
}
