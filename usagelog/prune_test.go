package usagelog

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// The billing statements that write logs by id are planned on the
// partitions of their ids only, as their code runs them (custom plans,
// planSettingsSQL): u.id = ANY($1) beside the join on the ids prunes by
// itself (the planner prunes by no join). Ids of two partitions are
// planned on those two, so the check can fail.
func TestBillingWritesArePlannedOnTheirIdsPartitionsOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	if _, err := EnsurePartitions(ctx, pool); err != nil {
		t.Fatal(err)
	}
	parts, err := Partitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) < 2 {
		t.Fatalf("usage_logs has partitions %+v; the test needs two or more", parts)
	}
	// Two ids of the first partition (every id below the first month's),
	// then one of them and one of the last partition.
	first := []uuid.UUID{uuid.MustParse(planLog(7)), uuid.MustParse(planLog(3))}
	last := parts[len(parts)-1]
	two := []uuid.UUID{first[0], IDFloor(last.Upper.Add(-time.Hour))}
	statements := []struct {
		name string
		sql  string
		args func(ids []uuid.UUID) []any
	}{
		{"form membership", formMembershipSQL, func(ids []uuid.UUID) []any {
			nulls := []*uuid.UUID{nil, nil}
			return []any{ids, nulls, nulls, []*uuid.UUID{}, []int32{0, 0}, []int32{0, 0}, []string{"usage", "usage"}}
		}},
		{"accept members", acceptMembersSQL, func(ids []uuid.UUID) []any {
			return []any{ids, []bool{true, true}, []bool{true, true}, []*string{nil, nil}}
		}},
	}
	for _, s := range statements {
		for _, c := range []struct {
			ids  []uuid.UUID
			want []string
		}{{first, []string{parts[0].Name}}, {two, []string{last.Name, parts[0].Name}}} {
			want := slices.Clone(c.want)
			sort.Strings(want)
			got := plannedPartitions(t, pool, s.sql, s.args(c.ids))
			if !slices.Equal(got, want) {
				t.Errorf("%s, ids %v: planned on %v, want %v", s.name, c.ids, got, want)
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
