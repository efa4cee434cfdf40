package usagelog

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// Reconciling a day reads the pages of that day, not every usage log: with
// 50,000 logs written after the day asked (the table grows, the answer
// does not), the sums of the day read a few BRIN ranges (usage_logs_ts,
// 0050), whatever the statistics, in transactions opened by
// rangeSettingsSQL as Billed opens its own. Without the index (control)
// they scan the whole table.
func TestBilledReadsTheDaysAskedNotTheTable(t *testing.T) {
	t.Parallel()
	const grown = 50_000
	const tenant = "00000000-0000-4000-8000-00000000fffd"
	day := "(date_trunc('day', now()) - interval '30 days')"
	probes := []pgtest.Probe{
		{Name: "billed", SQL: billedQuery(billedFilter{}), Settings: rangeSettingsSQL,
			Args: fmt.Sprintf("(%[1]s, %[1]s + interval '1 day', now(), %[2]v)", day, lateReach.Seconds())},
		{Name: "billed (tenants)", SQL: billedQuery(billedFilter{tenants: true}), Settings: rangeSettingsSQL,
			Args: fmt.Sprintf("(%[1]s, %[1]s + interval '1 day', now(), %[3]v, '{%[2]s}')", day, tenant, lateReach.Seconds())},
		{Name: "billed on meters", SQL: billedOnMetersQuery(billedFilter{}), Settings: rangeSettingsSQL,
			Args: fmt.Sprintf("(%[1]s, %[1]s + interval '1 day', %[2]v)", day, lateReach.Seconds())},
	}
	for _, c := range []struct {
		name    string
		rows    int
		noIndex bool
	}{{"never analysed", 0, false}, {"analysed at 5 rows", 5, false}, {"without usage_logs_ts (control)", 5, true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, _ := pgtest.NewPool(t)
			if c.noIndex {
				if _, err := pool.Exec(ctx, `DROP INDEX usage_logs_ts`); err != nil {
					t.Fatal(err)
				}
			}
			seedDays(t, pool, tenant, day, 1, c.rows)
			if c.rows > 0 {
				if _, err := pool.Exec(ctx, `ANALYZE`); err != nil {
					t.Fatal(err)
				}
			}
			conn, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			pgtest.CachePlans(t, conn.Conn(), probes)
			seedDays(t, pool, tenant, day, c.rows+1, grown)
			if !c.noIndex {
				// What autosummarize has autovacuum do as each range fills, in
				// each partition's index.
				if _, err := pool.Exec(ctx, `SELECT brin_summarize_new_values(inhrelid::regclass) FROM pg_inherits WHERE inhparent = 'usage_logs_ts'::regclass`); err != nil {
					t.Fatal(err)
				}
			}
			for i, r := range pgtest.PlanReads(t, conn.Conn(), probes) {
				// One range of 32 pages holds the day's 5 logs and some of
				// the next day's, which the recheck drops.
				bounded := r.Pages <= 100 && r.Removed <= 2000
				if bounded == c.noIndex {
					t.Errorf("%s of a day of 5 logs among %d: %v pages read, %v rows removed by filters; want bounded %v\n%s",
						probes[i].Name, grown, r.Pages, r.Removed, !c.noIndex, r.Plan)
				}
			}
		})
	}
}

// seedDays writes logs from..to of tenant, billed, in ts order: logs 1 to 5
// on day, the others on the days after it; every fifth with a line of
// another meter.
func seedDays(t *testing.T, pool *pgxpool.Pool, tenant, day string, from, to int) {
	t.Helper()
	if to < from {
		return
	}
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id) VALUES ($1, 't', 'cus_t') ON CONFLICT DO NOTHING`, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status, billed_at,
			meter_keys, meter_tokens, meter_overage)
		SELECT uuidv7(), $1, 'r' || g, ts, 'u', 'm', 10, 10, date_trunc('month', ts), 10, 0, 'billed', ts,
			CASE WHEN g % 5 = 0 THEN '{cached_in}'::text[] END, CASE WHEN g % 5 = 0 THEN '{3}'::bigint[] END,
			CASE WHEN g % 5 = 0 THEN '{3}'::bigint[] END
		FROM (SELECT g, CASE WHEN g <= 5 THEN `+day+` + g * interval '1 minute'
				ELSE `+day+` + interval '1 day' + g * interval '30 seconds' END AS ts
			FROM generate_series($2::int, $3::int) g) s`, tenant, from, to); err != nil {
		t.Fatal(err)
	}
}
