package usagelog_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/usagelog"
)

// billedLog is a usage log seeded for the billed sums: its overage on the
// default meters and, when key is set, on one other meter.
type billedLog struct {
	tenant        uuid.UUID
	request       string
	ts            time.Time
	status        string
	in, out       int64
	key           string
	other         int64
	firstAttempts *time.Time
}

func seedBilled(t *testing.T, pool *pgxpool.Pool, logs []billedLog) {
	t.Helper()
	for _, l := range logs {
		var keys []string
		var tokens, over []int64
		if l.key != "" {
			keys, tokens, over = []string{l.key}, []int64{l.other}, []int64{l.other}
		}
		var billedAt *time.Time
		if l.status == "billed" {
			billedAt = &l.ts
		}
		if _, err := pool.Exec(context.Background(), `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id,
				input_tokens, output_tokens, period_start, overage_input_tokens, overage_output_tokens, billing_status, billed_at,
				first_attempt_at, meter_keys, meter_tokens, meter_overage)
			VALUES (uuidv7(), $1, $2, $3, 'u', 'm', $4, $5, date_trunc('month', $3::timestamptz, 'UTC'), $4, $5, $6, $7, $8, $9, $10, $11)`,
			l.tenant, l.request, l.ts, l.in, l.out, l.status, billedAt, l.firstAttempts, keys, tokens, over); err != nil {
			t.Fatal(err)
		}
	}
}

// The billed sums add the billed logs' overage per customer (tenants
// sharing one added together) and meter, and nothing of the logs pending,
// under review, failed or not billable; BilledTotals folds the days, and
// its tenant and request_id filters narrow what it adds. The counts of the
// same logs by status agree.
func TestBilledSumsPerCustomerAndMeter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	a1, a2, b := uuid.New(), uuid.New(), uuid.New()
	for _, tn := range []struct {
		id  uuid.UUID
		cus string
	}{{a1, "cus_a"}, {a2, "cus_a"}, {b, "cus_b"}} {
		if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id) VALUES ($1, $2, $3)`, tn.id, tn.id.String(), tn.cus); err != nil {
			t.Fatal(err)
		}
	}
	day1 := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -3).Add(time.Hour)
	day2 := day1.AddDate(0, 0, 1)
	recent := time.Now()
	seedBilled(t, pool, []billedLog{
		{tenant: a1, request: "run1-1", ts: day1, status: "billed", in: 10, out: 1, key: "cache_read", other: 100},
		{tenant: a2, request: "run1-2", ts: day1, status: "billed", in: 20, out: 2},
		{tenant: a1, request: "run2-1", ts: day2, status: "billed", in: 30, out: 3, key: "cache_read", other: 200},
		{tenant: a1, request: "run1-3", ts: day2, status: "pending", in: 1000, out: 1000, key: "cache_read", other: 1000, firstAttempts: &recent},
		{tenant: a2, request: "run1-4", ts: day1, status: "needs_review", in: 1000, out: 1000},
		{tenant: a2, request: "run1-5", ts: day2, status: "failed", in: 1000, out: 1000},
		{tenant: b, request: "run1-6", ts: day1, status: "not_billable", in: 0, out: 0},
		{tenant: b, request: "run1_7", ts: day2, status: "billed", in: 5, out: 0, key: "cache_read", other: 7},
	})

	type cm = usagelog.CustomerMeter
	for _, c := range []struct {
		name    string
		tenants []uuid.UUID
		prefix  string
		want    map[cm]int64
	}{
		{"every tenant", nil, "", map[cm]int64{
			{"cus_a", "input"}: 60, {"cus_a", "output"}: 6, {"cus_a", "cache_read"}: 300,
			{"cus_b", "input"}: 5, {"cus_b", "output"}: 0, {"cus_b", "cache_read"}: 7}},
		{"one tenant of a shared customer", []uuid.UUID{a2}, "", map[cm]int64{
			{"cus_a", "input"}: 20, {"cus_a", "output"}: 2}},
		// "_" is no wildcard: run1_7 is not of run1-.
		{"a request_id prefix", nil, "run1-", map[cm]int64{
			{"cus_a", "input"}: 30, {"cus_a", "output"}: 3, {"cus_a", "cache_read"}: 100}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := usagelog.BilledTotals(ctx, pool, c.tenants, c.prefix)
			if err != nil {
				t.Fatal(err)
			}
			// A key of 0 (logs not billed, or no overage on the meter) is
			// no sum to compare.
			maps.DeleteFunc(got, func(_ cm, n int64) bool { return n == 0 })
			maps.DeleteFunc(c.want, func(_ cm, n int64) bool { return n == 0 })
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("billed totals\n got %v\nwant %v", got, c.want)
			}
		})
	}

	// The counts the demo and a lifted suspension read, of the same logs.
	if n, err := usagelog.CountInStatus(ctx, pool, []uuid.UUID{a1, a2}, overage.BillingStatusBilled); err != nil || n != 3 {
		t.Errorf("billed logs of a1 and a2: %d, %v; want 3", n, err)
	}
	runs, err := usagelog.CountRunByStatus(ctx, pool, []uuid.UUID{a1, a2, b}, "run1-")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(runs[a1], runs[a2], runs[b]), "map[billed:1 pending:1] map[billed:1 failed:1 needs_review:1] map[not_billable:1]"; got != want {
		t.Errorf("logs of run1- by tenant and status: %s, want %s", got, want)
	}
	for id, want := range map[uuid.UUID]bool{a1: true, a2: false} {
		if got, err := usagelog.HasPending(ctx, pool, id); err != nil || got != want {
			t.Errorf("HasPending(%s) = %v, %v; want %v", id, got, err, want)
		}
	}

	// By day: the days asked only, and the activity after the cutoff of
	// any status but not_billable (the pending log first sent just now).
	from := day1.Truncate(24 * time.Hour)
	s, err := usagelog.Billed(ctx, pool, usagelog.BilledParams{From: from, End: from.AddDate(0, 0, 2), Cutoff: recent.Add(-time.Minute), Meters: true})
	if err != nil {
		t.Fatal(err)
	}
	d1, d2 := day1.Format("2006-01-02"), day2.Format("2006-01-02")
	for k, want := range map[usagelog.BilledKey]int64{
		{"cus_a", "input", d1}: 30, {"cus_a", "input", d2}: 30, {"cus_a", "cache_read", d1}: 100, {"cus_a", "cache_read", d2}: 200,
		{"cus_b", "input", d2}: 5, {"cus_b", "cache_read", d2}: 7,
	} {
		if s.Overage[k] != want {
			t.Errorf("billed %v = %d, want %d", k, s.Overage[k], want)
		}
	}
	if want := map[usagelog.CustomerDay]bool{{"cus_a", d2}: true}; fmt.Sprint(s.Active) != fmt.Sprint(want) {
		t.Errorf("activity after the cutoff %v, want %v", s.Active, want)
	}
	s, err = usagelog.Billed(ctx, pool, usagelog.BilledParams{From: from.AddDate(0, 0, 1), End: from.AddDate(0, 0, 2), Cutoff: recent})
	if err != nil {
		t.Fatal(err)
	}
	for k, n := range s.Overage {
		if k.Day != d2 || k.Meter == "cache_read" {
			t.Errorf("billed %v = %d: not of the day asked, or of a meter not asked", k, n)
		}
	}
}
