package billingtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// countersAgainstLinesSQL compares period_counters with the sums of the
// logs' lines, counted one line at a time as the backfill (0042) counts
// them: the default meters' columns and unnest of meter_keys with
// meter_overage. One row per (tenant, period, meter, status) either side
// has, with what each side holds.
const countersAgainstLinesSQL = `
	WITH want AS (
		SELECT u.tenant_id, u.period_start, m.meter, u.billing_status, sum(m.o) AS n
		FROM usage_logs u CROSS JOIN LATERAL (
			SELECT 'input'::text AS meter, coalesce(u.overage_input_tokens, u.input_tokens) AS o
			UNION ALL SELECT 'output', coalesce(u.overage_output_tokens, u.output_tokens)
			UNION ALL SELECT x.k, x.o FROM unnest(u.meter_keys, u.meter_overage) AS x (k, o)
		) AS m
		GROUP BY 1, 2, 3, 4 HAVING sum(m.o) <> 0
	), have AS (
		SELECT tenant_id, period_start, meter, billing_status, sum(overage_tokens) AS n
		FROM period_counters GROUP BY 1, 2, 3, 4 HAVING sum(overage_tokens) <> 0
	)
	SELECT coalesce(w.meter, h.meter) || '/' || coalesce(w.billing_status, h.billing_status) || ': counted ' ||
		coalesce(h.n, 0) || ', logs ' || coalesce(w.n, 0), w.n IS DISTINCT FROM h.n
	FROM want w FULL JOIN have h USING (tenant_id, period_start, meter, billing_status)`

// CountersAgainstLines reads every (tenant, period, meter, status) group
// of period_counters and of the logs' lines: those whose totals differ,
// each described, and how many groups there are in all.
func CountersAgainstLines(t testing.TB, pool *pgxpool.Pool) (differ []string, groups int) {
	t.Helper()
	rows, err := pool.Query(context.Background(), countersAgainstLinesSQL)
	if err != nil {
		t.Fatalf("compare period_counters with the logs: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		var bad bool
		if err := rows.Scan(&s, &bad); err != nil {
			t.Fatalf("compare period_counters with the logs: %v", err)
		}
		groups++
		if bad {
			differ = append(differ, s)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("compare period_counters with the logs: %v", err)
	}
	return differ, groups
}
