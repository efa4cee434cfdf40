package finance

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// The status reads read what they answer whatever the statistics were
// when their plans were made: plans cached on empty tables or at 5 logs
// are used on 50,000 logs of the tenant, one of them pending, in
// transactions opened by readSettingsSQL as Status and StatusPage open
// theirs. The totals read without it (as it was: no parameters, so one
// plan cached for good) finds the oldest pending log by reading every log
// once planned at 5 rows, so the measure can fail.
func TestStatusReadsReadOnlyWhatTheyAnswerAtAnyStatistics(t *testing.T) {
	t.Parallel()
	const grown = 50_000
	const tenant = "00000000-0000-4000-8000-00000000fffe"
	probes := []pgtest.Probe{
		{Name: "one tenant", SQL: statusOneTenant, Args: fmt.Sprintf("('%s')", tenant), Settings: readSettingsSQL},
		{Name: "page", SQL: statusPage, Args: "(NULL, NULL, 51)", Settings: readSettingsSQL},
		{Name: "totals", SQL: totalsQuery, Settings: readSettingsSQL},
		{Name: "meters (all)", SQL: fmt.Sprintf(extraMetersQuery, ""), Settings: readSettingsSQL},
		{Name: "meters (tenants)", SQL: fmt.Sprintf(extraMetersQuery, "AND c.tenant_id = ANY($1)"), Args: fmt.Sprintf("('{%s}')", tenant), Settings: readSettingsSQL},
		{Name: "totals before (control)", SQL: totalsQuery},
	}
	for _, stats := range []struct {
		name string
		rows int
	}{{"never analysed", 0}, {"analysed at 5 rows", 5}} {
		t.Run(stats.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, _ := pgtest.NewPool(t)
			seedStatusLogs(t, pool, tenant, 1, stats.rows)
			if stats.rows > 0 {
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
			seedStatusLogs(t, pool, tenant, stats.rows+1, grown)
			for i, r := range pgtest.PlanReads(t, conn.Conn(), probes) {
				control := strings.HasSuffix(probes[i].Name, "(control)")
				if control && stats.rows == 0 {
					continue
				}
				// The meters' reads filter out the default meters' counter
				// rows (a few per period, status and slot): bounded by the
				// counters, never by the logs.
				removedMax := 3.0
				if strings.HasPrefix(probes[i].Name, "meters") {
					removedMax = 400
				}
				if bounded := r.Pages <= 40 && r.Removed <= removedMax; bounded == control {
					t.Errorf("%s on %d logs of one tenant: %v pages read, %v rows removed by filters; want bounded %v\n%s",
						probes[i].Name, grown, r.Pages, r.Removed, !control, r.Plan)
				}
			}
		})
	}
}

// seedStatusLogs writes logs from..to of tenant: log 1 pending, the others
// billed, every fifth with a line of another meter.
func seedStatusLogs(t *testing.T, pool *pgxpool.Pool, tenant string, from, to int) {
	t.Helper()
	if to < from {
		return
	}
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id) VALUES ($1, 't', 'cus_t') ON CONFLICT DO NOTHING`, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO meters (key, event_name, token_type, models) VALUES ('cached_in', 'cached_in_tokens', 'cache_read', '{*}')
		ON CONFLICT DO NOTHING`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status, created_at,
			meter_keys, meter_tokens, meter_overage)
		SELECT uuidv7(), $1, 'r' || g, now(), 'u', 'm', 10, 10, date_trunc('month', now()), 10, 0,
			CASE WHEN g = 1 THEN 'pending' ELSE 'billed' END, now() - interval '1 day' + g * interval '1 ms',
			CASE WHEN g % 5 = 0 THEN '{cached_in}'::text[] END, CASE WHEN g % 5 = 0 THEN '{3}'::bigint[] END,
			CASE WHEN g % 5 = 0 THEN '{3}'::bigint[] END
		FROM generate_series($2::int, $3::int) g`, tenant, from, to); err != nil {
		t.Fatal(err)
	}
}
