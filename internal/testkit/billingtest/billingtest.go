// Package billingtest holds the one check every end-to-end billing test —
// and the demo of `overage dev` — ends with: what the Stripe emulator
// applied equals what PostgreSQL holds as billed, and nothing was applied
// twice.
package billingtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/usagelog"
)

// Meter event names the tests run with (the defaults).
const (
	InputEvent  = overage.DefaultMeterInputEvent
	OutputEvent = overage.DefaultMeterOutputEvent
)

// BilledTotals returns the overage PostgreSQL holds as billed, per Stripe
// customer and meter, in the emulator's shape.
func BilledTotals(t testing.TB, pool *pgxpool.Pool) map[emulator.AppliedKey]int64 {
	t.Helper()
	want, err := Billed(context.Background(), pool, InputEvent, OutputEvent)
	if err != nil {
		t.Fatal(err)
	}
	return want
}

// Billed returns the overage PostgreSQL holds as billed, per Stripe
// customer and meter (named inputEvent and outputEvent), in the emulator's
// shape: of the tenants given, or of every tenant when none is.
func Billed(ctx context.Context, pool *pgxpool.Pool, inputEvent, outputEvent string, tenantIDs ...string) (map[emulator.AppliedKey]int64, error) {
	var only []string
	if len(tenantIDs) > 0 {
		only = tenantIDs
	}
	rows, err := pool.Query(ctx, `SELECT t.stripe_customer_id, sum(u.overage_input_tokens), sum(u.overage_output_tokens)
		FROM usage_logs u JOIN tenants t ON t.id = u.tenant_id
		WHERE u.billing_status = $1 AND ($2::uuid[] IS NULL OR u.tenant_id = ANY($2::uuid[])) GROUP BY 1`, overage.BillingStatusBilled, only)
	if err != nil {
		return nil, fmt.Errorf("billed totals: %w", err)
	}
	defer rows.Close()
	billed := map[emulator.AppliedKey]int64{}
	for rows.Next() {
		var cus string
		var in, out int64
		if err := rows.Scan(&cus, &in, &out); err != nil {
			return nil, fmt.Errorf("billed totals: %w", err)
		}
		if in != 0 {
			billed[emulator.AppliedKey{Customer: cus, EventName: inputEvent}] = in
		}
		if out != 0 {
			billed[emulator.AppliedKey{Customer: cus, EventName: outputEvent}] = out
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("billed totals: %w", err)
	}
	// The meters other than the defaults: their lines, by the meter's
	// event name.
	rows, err = pool.Query(ctx, `SELECT t.stripe_customer_id, m.event_name, sum(x.o)::bigint
		FROM usage_logs u JOIN tenants t ON t.id = u.tenant_id
		CROSS JOIN LATERAL unnest(u.meter_keys, u.meter_overage) AS x (k, o) JOIN meters m ON m.key = x.k
		WHERE u.billing_status = $1 AND u.meter_keys IS NOT NULL AND ($2::uuid[] IS NULL OR u.tenant_id = ANY($2::uuid[]))
		GROUP BY 1, 2`, overage.BillingStatusBilled, only)
	if err != nil {
		return nil, fmt.Errorf("billed totals of meters: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var cus, name string
		var n int64
		if err := rows.Scan(&cus, &name, &n); err != nil {
			return nil, fmt.Errorf("billed totals of meters: %w", err)
		}
		if n != 0 {
			billed[emulator.AppliedKey{Customer: cus, EventName: name}] += n
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("billed totals of meters: %w", err)
	}
	return billed, nil
}

// Disagreement says how what the emulator applied differs from billed —
// its totals per customer and meter, and any identifier it applied more
// than once — or "" when Stripe holds exactly what PostgreSQL billed.
func Disagreement(emu *emulator.Emulator, billed map[emulator.AppliedKey]int64) string {
	got := emu.Applied()
	// Corrections may bring a meter's net total back to zero, which
	// PostgreSQL's sum shows as no row.
	for k, v := range got {
		if v == 0 {
			delete(got, k)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(billed) {
		return fmt.Sprintf("Stripe applied %v\nPostgreSQL billed %v", got, billed)
	}
	for _, e := range emu.Events() {
		if n := emu.AppliedCount(e.Identifier); n != 1 {
			return fmt.Sprintf("identifier %s applied %d times", e.Identifier, n)
		}
	}
	return ""
}

// RequireStripeMatchesBilled fails t unless the emulator's applied totals
// per customer and meter equal the overage PostgreSQL holds as billed, and
// no identifier was applied more than once.
func RequireStripeMatchesBilled(t testing.TB, pool *pgxpool.Pool, emu *emulator.Emulator) {
	t.Helper()
	if d := Disagreement(emu, BilledTotals(t, pool)); d != "" {
		t.Fatal(d)
	}
	for _, e := range emu.Events() {
		// Every event Stripe took is one accepted report, with the value
		// and timestamp committed for it before its first send.
		var value int64
		var ts time.Time
		var state string
		if err := pool.QueryRow(context.Background(), `SELECT value, ts, state FROM usage_reports
			WHERE 'usage-log:' || lead_usage_log_id || ':' || dimension = $1`, e.Identifier).Scan(&value, &ts, &state); err != nil {
			t.Fatalf("Stripe applied %s, which is no report: %v", e.Identifier, err)
		}
		if value != e.Value || !ts.Truncate(time.Second).Equal(e.Timestamp.Truncate(time.Second)) || state != string(usagelog.ReportAccepted) {
			t.Fatalf("Stripe applied %s with value %d at %s; its report has %d at %s and is %s", e.Identifier, e.Value, e.Timestamp, value, ts, state)
		}
	}
}
