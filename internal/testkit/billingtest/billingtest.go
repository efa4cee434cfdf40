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

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/meters"
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
// customer and meter (the default meters named inputEvent and
// outputEvent, the others by the catalog), in the emulator's shape: of the
// tenants given, or of every tenant when none is. The sums are
// usagelog.BilledTotals, the ones reconciliation and the demo read.
func Billed(ctx context.Context, pool *pgxpool.Pool, inputEvent, outputEvent string, tenantIDs ...string) (map[emulator.AppliedKey]int64, error) {
	var only []uuid.UUID
	for _, s := range tenantIDs {
		id, err := uuid.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("billed totals: tenant %q: %w", s, err)
		}
		only = append(only, id)
	}
	totals, err := usagelog.BilledTotals(ctx, pool, only, "")
	if err != nil {
		return nil, fmt.Errorf("billed totals: %w", err)
	}
	cat, err := meters.NewStore(pool, inputEvent, outputEvent).Catalog(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("billed totals: %w", err)
	}
	billed := map[emulator.AppliedKey]int64{}
	for k, n := range totals {
		m, ok := cat.Meter(k.Meter)
		if !ok {
			return nil, fmt.Errorf("billed totals: usage logs name the meter %q, which the catalog does not hold", k.Meter)
		}
		if n != 0 {
			billed[emulator.AppliedKey{Customer: k.Customer, EventName: m.EventName}] += n
		}
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
		r, err := usagelog.ReportByKey(context.Background(), pool, e.Identifier)
		if err != nil {
			t.Fatalf("Stripe applied %s, which is no report: %v", e.Identifier, err)
		}
		if r.Value != e.Value || !r.Timestamp.Truncate(time.Second).Equal(e.Timestamp.Truncate(time.Second)) || r.State != usagelog.ReportAccepted {
			t.Fatalf("Stripe applied %s with value %d at %s; its report has %d at %s and is %s", e.Identifier, e.Value, e.Timestamp, r.Value, r.Timestamp, r.State)
		}
	}
}
