// Package billingtest holds the one assertion every end-to-end billing test
// ends with: what the Stripe emulator applied equals what PostgreSQL holds
// as billed, and nothing was applied twice.
package billingtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/usagelog"
)

// Meter event names the tests run with (the defaults).
const (
	InputEvent  = "llm_input_tokens"
	OutputEvent = "llm_output_tokens"
)

// BilledTotals returns the overage PostgreSQL holds as billed, per Stripe
// customer and meter, in the emulator's shape.
func BilledTotals(t testing.TB, pool *pgxpool.Pool) map[emulator.AppliedKey]int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT t.stripe_customer_id, sum(u.overage_input_tokens), sum(u.overage_output_tokens)
		FROM usage_logs u JOIN tenants t ON t.id = u.tenant_id WHERE u.billing_status = $1 GROUP BY 1`, usagelog.StatusBilled)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	want := map[emulator.AppliedKey]int64{}
	for rows.Next() {
		var cus string
		var in, out int64
		if err := rows.Scan(&cus, &in, &out); err != nil {
			t.Fatal(err)
		}
		if in != 0 {
			want[emulator.AppliedKey{Customer: cus, EventName: InputEvent}] = in
		}
		if out != 0 {
			want[emulator.AppliedKey{Customer: cus, EventName: OutputEvent}] = out
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return want
}

// RequireStripeMatchesBilled fails t unless the emulator's applied totals
// per customer and meter equal the overage PostgreSQL holds as billed, and
// no identifier was applied more than once.
func RequireStripeMatchesBilled(t testing.TB, pool *pgxpool.Pool, emu *emulator.Emulator) {
	t.Helper()
	want := BilledTotals(t, pool)
	got := emu.Applied()
	// Corrections may bring a meter's net total back to zero, which
	// PostgreSQL's sum shows as no row.
	for k, v := range got {
		if v == 0 {
			delete(got, k)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Stripe applied %v\nPostgreSQL billed %v", got, want)
	}
	for _, e := range emu.Events() {
		if n := emu.AppliedCount(e.Identifier); n != 1 {
			t.Fatalf("identifier %s applied %d times", e.Identifier, n)
		}
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
