package migrations_test

import (
	"context"
	"testing"

	"github.com/overage-billing/overage/internal/testkit/billingtest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// The period_counters triggers sum a statement's logs per group of meter
// keys and expand only the groups (0043): every shape of lines must count
// as one line at a time would — the defaults only, keys shared and not,
// in another order, more lines than kinds of token (a correction's), arrays
// that do not start at 1, lines that cancel — through inserts, updates of
// status and overage, and deletes, in several slots.
func TestPeriodCountersCountEveryLine(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	check := func(step string) {
		t.Helper()
		differ, _ := billingtest.CountersAgainstLines(t, pool)
		for _, d := range differ {
			t.Errorf("%s: %s", step, d)
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens, period_start,
			overage_input_tokens, overage_output_tokens, billing_status, meter_keys, meter_tokens, meter_overage)
		SELECT uuidv7(), t.tenant::uuid, now(), 'u', 'm', 100, 50, t.period::timestamptz, t.oi, t.oo, t.status,
			t.keys::text[], t.over::bigint[], t.over::bigint[]
		FROM (VALUES
			('00000000-0000-0000-0000-00000000000a', '2026-11-01', 10, 5, 'pending', NULL, NULL),
			('00000000-0000-0000-0000-00000000000a', '2026-11-01', 0, 4, 'pending', '{m_a,m_b,m_c}', '{1,2,3}'),
			('00000000-0000-0000-0000-00000000000a', '2026-11-01', 0, 0, 'pending', '{m_a,m_b,m_c}', '{10,20,30}'),
			('00000000-0000-0000-0000-00000000000a', '2026-11-01', 7, 0, 'pending', '{m_b,m_a}', '{5,6}'),
			('00000000-0000-0000-0000-00000000000a', '2026-11-01', 0, 0, 'pending', '{m_a}', '{-17}'),
			('00000000-0000-0000-0000-00000000000a', '2026-11-01', 1, 1, 'billed', '{k1,k2,k3,k4,k5,k6,k7}', '{1,2,3,4,5,6,7}'),
			('00000000-0000-0000-0000-00000000000a', '2026-11-01', 0, 0, 'billed', '{k7,k6,k5,k4,k3,k2,k1,m_a}', '{70,60,50,40,30,20,10,9}'),
			('00000000-0000-0000-0000-00000000000a', '2026-12-01', 3, 3, 'pending', '{m_a,m_b,m_c}', '{100,200,300}'),
			('00000000-0000-0000-0000-00000000000b', '2026-11-01', 0, 0, 'pending', '[0:2]={m_a,m_b,m_c}', '[3:5]={1000,2000,3000}'),
			('00000000-0000-0000-0000-00000000000b', '2026-11-01', 0, 0, 'pending', '{m_a,m_b,m_c}', '{-1,-2,-3}'),
			('00000000-0000-0000-0000-00000000000b', '2026-11-01', 0, 0, 'pending', '{}', '{}')
		) AS t (tenant, period, oi, oo, status, keys, over)`)
	check("insert")
	// A second statement in another slot, of keys seen and not.
	exec(`BEGIN; SELECT set_config('overage.slot', '3', true);
		INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens, period_start,
			overage_input_tokens, overage_output_tokens, billing_status, meter_keys, meter_tokens, meter_overage)
		SELECT uuidv7(), '00000000-0000-0000-0000-00000000000a', now(), 'u', 'm', 100, 50, '2026-11-01', n, 0, 'pending',
			CASE WHEN n % 2 = 0 THEN '{m_a,m_b,m_c}'::text[] ELSE '{m_c,m_d}' END,
			CASE WHEN n % 2 = 0 THEN ARRAY[n, n, n] ELSE ARRAY[n, 2 * n] END,
			CASE WHEN n % 2 = 0 THEN ARRAY[n, n, n] ELSE ARRAY[n, 2 * n] END
		FROM generate_series(1, 50) n; COMMIT`)
	check("insert in a slot")
	// The biller's update: status and overage of lines change, the keys stay.
	exec(`UPDATE usage_logs SET billing_status = 'billed',
			meter_overage = CASE WHEN cardinality(meter_overage) > 0 THEN array_fill(1::bigint, ARRAY[cardinality(meter_overage)], ARRAY[array_lower(meter_overage, 1)]) ELSE meter_overage END
		WHERE billing_status = 'pending' AND (meter_keys IS NULL OR cardinality(meter_keys) <> 2)`)
	check("update")
	exec(`UPDATE usage_logs SET billing_status = 'pending', overage_input_tokens = overage_input_tokens + 1
		WHERE billing_status = 'billed' AND cardinality(meter_keys) > 5`)
	check("update of long lines")
	exec(`DELETE FROM usage_logs WHERE tenant_id = '00000000-0000-0000-0000-00000000000b' OR cardinality(meter_keys) = 8`)
	check("delete")
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM period_counters WHERE meter IN ('k1', 'm_d')`).Scan(&n); err != nil || n == 0 {
		t.Fatalf("counters of the long and the slot's lines: %d, %v", n, err)
	}
}
