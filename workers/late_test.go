package workers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/worktest"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/usagelog"
	"github.com/overage-billing/overage/workers"
)

// lateWorld has tenants with 500 input tokens included whose previous
// subscription period ended at the given ages: cus_closed 3 h ago (past a
// PERIOD_CLOSE_GRACE of 1 h), cus_grace and cus_finalized 30 min ago
// (inside it; cus_finalized's invoice of that period is finalized).
func lateWorld(t *testing.T) (*worktest.World, time.Time) {
	t.Helper()
	w := worktest.New(t, worktest.Options{Tenants: []tenants.CreateParams{
		{StripeCustomerID: "cus_closed", IncludedInputTokens: 500},
		{StripeCustomerID: "cus_grace", IncludedInputTokens: 500},
		{StripeCustomerID: "cus_finalized", IncludedInputTokens: 500},
	}})
	ctx := context.Background()
	var now time.Time
	if err := w.Pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	for customer, ended := range map[string]time.Duration{"cus_closed": 3 * time.Hour, "cus_grace": 30 * time.Minute, "cus_finalized": 30 * time.Minute} {
		end := now.Add(-ended)
		if _, err := w.Pool.Exec(ctx, `INSERT INTO tenant_subscriptions (tenant_id, stripe_subscription_id, status, current_period_start, current_period_end, event_created)
			VALUES ($1, 'sub_old', 'active', $2, $3, now()), ($1, 'sub_new', 'active', $3, $4, now())`,
			w.Tenants[customer].ID, end.Add(-30*24*time.Hour), end, end.Add(30*24*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	end := now.Add(-30 * time.Minute)
	if _, err := w.Pool.Exec(ctx, `INSERT INTO closed_periods (tenant_id, stripe_invoice_id, period_start, period_end, event_created)
		VALUES ($1, 'in_1', $2, $3, now())`, w.Tenants["cus_finalized"].ID, end.Add(-30*24*time.Hour), end); err != nil {
		t.Fatal(err)
	}
	return w, now
}

// lateLog is what billing made of a log: its period, overage, basis and
// the timestamp of its input meter event at Stripe.
type lateLog struct {
	period    time.Time
	overage   int64
	basis     string
	stripeTS  time.Time
	reportTS  time.Time
	usageTS   time.Time
	sentCount int
}

func billedLog(t *testing.T, w *worktest.World, id uuid.UUID) lateLog {
	t.Helper()
	ctx := context.Background()
	var l lateLog
	var basis *string
	var lead uuid.UUID
	if err := w.Pool.QueryRow(ctx, `SELECT u.period_start, coalesce(u.overage_input_tokens, u.input_tokens), u.stripe_timestamp, u.ts, u.input_report_lead, r.ts
		FROM usage_logs u JOIN usage_reports r ON r.lead_usage_log_id = u.input_report_lead AND r.dimension = 'input'
		WHERE u.id = $1`, id).Scan(&l.period, &l.overage, &basis, &l.usageTS, &lead, &l.reportTS); err != nil {
		t.Fatal(err)
	}
	if basis != nil {
		l.basis = *basis
	}
	key := overage.MeterEventKey(lead, overage.DimensionInput)
	for _, e := range w.Emu.Events() {
		if e.Identifier == key {
			l.stripeTS = e.Timestamp
			l.sentCount++
		}
	}
	return l
}

// A log of the previous period ingested after that period closed is
// counted in it — its overage is against last period's allowance — and
// billed with the time its report was formed; one inside the grace keeps
// its usage timestamp; a finalized invoice closes the period at once.
func TestLateUsageOfAClosedPeriodIsBilledAtSendTime(t *testing.T) {
	t.Parallel()
	w, now := lateWorld(t)
	ctx := context.Background()
	usage := now.Add(-2 * 24 * time.Hour).Truncate(time.Second)
	// 400 then 300 input tokens of the previous period: 200 over its 500.
	ids := map[string][2]uuid.UUID{}
	for _, c := range []string{"cus_closed", "cus_grace", "cus_finalized"} {
		a := worktest.Record(t, w.Ingest, w.Tenants[c].ID, usage, 400, 0)
		key := "late-" + c
		o, err := w.Ingest.Record(ctx, ingest.RecordParams{TenantID: w.Tenants[c].ID, Key: key, Fingerprint: []byte(key),
			Event: &ingest.Event{Timestamp: usage.Add(time.Second), UserID: "u", ModelID: "m", InputTokens: 300}})
		if err != nil {
			t.Fatal(err)
		}
		// The answer already says which time Stripe will get.
		want := `"stripe_timestamp":"reported"`
		if c == "cus_grace" {
			want = `"stripe_timestamp":"usage"`
		}
		if !strings.Contains(string(o.Body), want) {
			t.Errorf("%s: the answer %s does not say %s", c, o.Body, want)
		}
		ids[c] = [2]uuid.UUID{a, o.UsageLogID}
	}
	// One of the current period: its own allowance, nothing over.
	current := worktest.Record(t, w.Ingest, w.Tenants["cus_closed"].ID, now.Add(-time.Minute), 300, 0)
	formedAfter := time.Now().Add(-time.Second)
	stop := w.Start(t, workers.Config{PeriodCloseGrace: time.Hour})
	defer stop()
	b := &bundle{World: w}
	for _, pair := range ids {
		b.waitStatus(t, pair[1], overage.BillingStatusBilled, 30*time.Second)
	}
	if s, _ := b.status(t, current); s != overage.BillingStatusNotBillable {
		t.Fatalf("the current period's log is %s, want not_billable (its own allowance)", s)
	}

	for c, wantBasis := range map[string]string{"cus_closed": usagelog.TimestampReported, "cus_grace": usagelog.TimestampUsage,
		"cus_finalized": usagelog.TimestampReported} {
		l := billedLog(t, w, ids[c][1])
		if l.overage != 200 {
			t.Errorf("%s: the late log's overage is %d, want 200 (700 tokens against last period's 500)", c, l.overage)
		}
		if l.period.After(now.Add(-24 * time.Hour)) {
			t.Errorf("%s: the late log is counted in the period of %s, want the previous one", c, l.period)
		}
		if l.basis != wantBasis {
			t.Errorf("%s: stripe_timestamp %q, want %q", c, l.basis, wantBasis)
		}
		if l.sentCount != 1 {
			t.Fatalf("%s: Stripe applied %d events for the late log's report, want 1", c, l.sentCount)
		}
		switch wantBasis {
		case usagelog.TimestampReported:
			if l.reportTS.Before(formedAfter) || l.stripeTS.Before(formedAfter.Truncate(time.Second)) {
				t.Errorf("%s: report timestamp %s, Stripe's %s; want the send time (after %s), not the usage time %s",
					c, l.reportTS, l.stripeTS, formedAfter, l.usageTS)
			}
		default:
			if !l.reportTS.Equal(l.usageTS) || !l.stripeTS.Equal(l.usageTS.Truncate(time.Second)) {
				t.Errorf("%s: report timestamp %s, Stripe's %s; want the usage timestamp %s", c, l.reportTS, l.stripeTS, l.usageTS)
			}
		}
		got, err := w.Ingest.Get(ctx, ids[c][1], nil)
		if err != nil {
			t.Fatal(err)
		}
		if got.StripeTimestamp != wantBasis {
			t.Errorf("%s: GET shows stripe_timestamp %q, want %q", c, got.StripeTimestamp, wantBasis)
		}
	}
}

// Late logs billed through lost answers and 500s: every resend of a report
// carries the timestamp fixed when it was formed (the emulator refuses a
// key resent with other parameters), each is applied once, and Stripe
// holds exactly the overage the closed period owes.
func TestLateUsageIsBilledExactlyOnceUnderFaults(t *testing.T) {
	t.Parallel()
	w := worktest.New(t, worktest.Options{
		Emulator: emulator.Options{Faults: emulator.Faults{ServerErrorRate: 0.2, LostResponseRate: 0.3}},
		Tenants:  []tenants.CreateParams{{StripeCustomerID: "cus_closed", IncludedInputTokens: 500}},
	})
	ctx := context.Background()
	tenant := w.Tenants["cus_closed"].ID
	end := time.Now().Add(-3 * time.Hour)
	if _, err := w.Pool.Exec(ctx, `INSERT INTO tenant_subscriptions (tenant_id, stripe_subscription_id, status, current_period_start, current_period_end, event_created)
		VALUES ($1, 'sub_old', 'active', $2, $3, now()), ($1, 'sub_new', 'active', $3, $4, now())`,
		tenant, end.Add(-30*24*time.Hour), end, end.Add(30*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	formedAfter := time.Now().Add(-time.Second)
	var ids []uuid.UUID
	for i := range 40 {
		ids = append(ids, worktest.Record(t, w.Ingest, tenant, end.Add(-time.Duration(i+1)*time.Hour), 100, 10))
	}
	stop := w.Start(t, workers.Config{PeriodCloseGrace: time.Hour, BatchMax: 7})
	defer stop()
	b := &bundle{World: w}
	for _, id := range ids {
		b.waitStatus(t, id, overage.BillingStatusBilled, 60*time.Second)
	}
	var notReported int
	if err := w.Pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE tenant_id = $1 AND stripe_timestamp IS DISTINCT FROM 'reported'`, tenant).
		Scan(&notReported); err != nil {
		t.Fatal(err)
	}
	if notReported != 0 {
		t.Fatalf("%d late logs not recorded as reported", notReported)
	}
	var sum int64
	for _, e := range w.Emu.Events() {
		if w.Emu.AppliedCount(e.Identifier) != 1 {
			t.Fatalf("%s applied %d times", e.Identifier, w.Emu.AppliedCount(e.Identifier))
		}
		if e.Timestamp.Before(formedAfter.Truncate(time.Second)) {
			t.Fatalf("meter event %s carries %s, want its report's formation time (after %s)", e.Identifier, e.Timestamp, formedAfter)
		}
		if e.EventName == overage.DefaultMeterInputEvent {
			sum += e.Value
		}
	}
	// 4,000 input tokens of the closed period against its 500.
	if sum != 3500 {
		t.Fatalf("Stripe holds %d input tokens, want 3500", sum)
	}
	for _, r := range w.Emu.Requests() {
		if r.Status == 400 {
			t.Fatalf("Stripe refused a resend: %+v", r)
		}
	}
}
