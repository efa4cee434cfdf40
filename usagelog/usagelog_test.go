package usagelog_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/testkit/worktest"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/usagelog"
)

// Four jobs of one tenant forming reports at once never put a log in two
// reports of one dimension: FOR UPDATE SKIP LOCKED and the report column
// set once are the referee. Every log with overage in a dimension ends in
// exactly one report of it, each report's value is its members' sum, and
// the sums agree with the logs.
func TestConcurrentFormsNeverShareALog(t *testing.T) {
	t.Parallel()
	w := worktest.New(t, worktest.Options{Tenants: []tenants.CreateParams{{StripeCustomerID: "cus_form"}}})
	tn := w.Tenants["cus_form"].ID
	var ids []uuid.UUID
	for i := range 120 {
		// Every third log has no output overage.
		ids = append(ids, worktest.Record(t, w.Ingest, tn, time.Now().Add(-time.Minute), int64(i+1), int64(i%3)))
	}
	store := usagelog.New(w.Pool)
	p := usagelog.FormParams{TenantID: tn, MaxLogs: 7, Lease: time.Minute, Guard: usagelog.GuardFor(24 * time.Hour)}
	var mu sync.Mutex
	var reports []usagelog.Report
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				rs, err := store.Form(context.Background(), p)
				if err != nil {
					t.Error(err)
					return
				}
				if len(rs) == 0 {
					return
				}
				mu.Lock()
				reports = append(reports, rs...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	in := map[uuid.UUID]int{}
	out := map[uuid.UUID]int{}
	var sum [2]int64
	for _, r := range reports {
		if len(r.Members) > p.MaxLogs || r.Members[0] != r.Lead || r.State != usagelog.ReportOpen || r.Remaining < 22*time.Hour || r.Remaining > 23*time.Hour {
			t.Fatalf("report %+v", r)
		}
		for _, m := range r.Members {
			if r.Dimension == overage.DimensionInput {
				in[m]++
			} else {
				out[m]++
			}
		}
		if r.Dimension == overage.DimensionInput {
			sum[0] += r.Value
		} else {
			sum[1] += r.Value
		}
	}
	var wantIn, wantOut int64
	for i, id := range ids {
		wantIn += int64(i + 1)
		wantOut += int64(i % 3)
		if in[id] != 1 {
			t.Fatalf("log %d is in %d input reports", i, in[id])
		}
		if want := min(i%3, 1); out[id] != want {
			t.Fatalf("log %d (output overage %d) is in %d output reports", i, i%3, out[id])
		}
	}
	if sum[0] != wantIn || sum[1] != wantOut {
		t.Fatalf("report values sum to %v, the logs' overage to %d/%d", sum, wantIn, wantOut)
	}
	// Nothing is left to form, and the column on each log names its report.
	if rs, err := store.Form(context.Background(), p); err != nil || len(rs) != 0 {
		t.Fatalf("formed again: %+v %v", rs, err)
	}
	var unformed int
	if err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM usage_logs
		WHERE input_report_lead IS NULL OR (coalesce(overage_output_tokens, output_tokens) > 0) <> (output_report_lead IS NOT NULL)`).Scan(&unformed); err != nil || unformed != 0 {
		t.Fatalf("%d logs whose report columns disagree (%v)", unformed, err)
	}
}

// One acceptance bills members of every status it finds in one statement:
// here the members of a report the window guard parked while its send was
// in flight (needs_review) and a pending report's, accepted together. Each
// log is billed once, its message cleared, and the counters move from
// both statuses to billed; billing stamps no log's updated_at.
func TestOneAcceptanceBillsPendingAndParkedMembers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := worktest.New(t, worktest.Options{Tenants: []tenants.CreateParams{{StripeCustomerID: "cus_mixed"}}})
	tn := w.Tenants["cus_mixed"].ID
	for i := range 4 {
		worktest.Record(t, w.Ingest, tn, time.Now().Add(-time.Minute), int64(i+1), 2)
	}
	store := usagelog.New(w.Pool)
	g := usagelog.GuardFor(24 * time.Hour)
	p := usagelog.FormParams{TenantID: tn, MaxLogs: 2, Lease: time.Minute, Guard: g}
	parked, err := store.Form(ctx, p)
	if err != nil || len(parked) != 2 {
		t.Fatalf("first form: %+v %v", parked, err)
	}
	pending, err := store.Form(ctx, p)
	if err != nil || len(pending) != 2 {
		t.Fatalf("second form: %+v %v", pending, err)
	}
	// The first reports' first send is a day old: past the guard.
	if _, err := w.Pool.Exec(ctx, `UPDATE usage_reports SET first_attempt_at = now() - interval '25 hours'
		WHERE lead_usage_log_id = $1`, parked[0].Lead); err != nil {
		t.Fatal(err)
	}
	if n, err := store.Park(ctx, parked[0], g); err != nil || n != 2 {
		t.Fatalf("park: %d logs, %v", n, err)
	}
	// The tenant's logs counted per status: pending, under review, billed
	// and any other.
	counters := func() [4]int64 {
		t.Helper()
		var c [4]int64
		if err := w.Pool.QueryRow(ctx, `SELECT coalesce(sum(usage_logs) FILTER (WHERE billing_status = 'pending'), 0)::bigint,
				coalesce(sum(usage_logs) FILTER (WHERE billing_status = 'needs_review'), 0)::bigint,
				coalesce(sum(usage_logs) FILTER (WHERE billing_status = 'billed'), 0)::bigint,
				coalesce(sum(usage_logs) FILTER (WHERE billing_status NOT IN ('pending', 'needs_review', 'billed')), 0)::bigint
			FROM billing_counters WHERE tenant_id = $1`, tn).Scan(&c[0], &c[1], &c[2], &c[3]); err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := counters(); c != [4]int64{2, 2, 0, 0} {
		t.Fatalf("counters before the acceptance (pending, under review, billed, other): %v", c)
	}
	n, err := store.Accept(ctx, append(parked, pending...)...)
	if err != nil || n != 4 {
		t.Fatalf("accept: %d logs written, %v", n, err)
	}
	var billed, messages int
	if err := w.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE billing_status = 'billed' AND billed_at IS NOT NULL),
			count(billing_message) FROM usage_logs WHERE tenant_id = $1`, tn).Scan(&billed, &messages); err != nil {
		t.Fatal(err)
	}
	if billed != 4 || messages != 0 {
		t.Fatalf("%d of 4 logs billed, %d with a message", billed, messages)
	}
	// Formation and acceptance leave updated_at alone (0072: their own
	// columns say when); parking set it on the parked report's logs.
	var stamped, parkedStamped int
	if err := w.Pool.QueryRow(ctx, `SELECT count(updated_at), count(updated_at) FILTER (WHERE input_report_lead = $2)
		FROM usage_logs WHERE tenant_id = $1`, tn, parked[0].Lead).Scan(&stamped, &parkedStamped); err != nil {
		t.Fatal(err)
	}
	if stamped != 2 || parkedStamped != 2 {
		t.Errorf("updated_at set on %d logs (%d of the parked report's); want the 2 parking changed", stamped, parkedStamped)
	}
	// The logs nothing but billing changed are stored without the accepted
	// times billed_at repeats (0073); the parked ones, which parking
	// changed, keep theirs: there a NULL would mean Stripe never took them.
	var compact, full int
	if err := w.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE input_accepted_at IS NULL AND output_accepted_at IS NULL AND updated_at IS NULL),
			count(*) FILTER (WHERE input_accepted_at = billed_at AND output_accepted_at = billed_at AND input_report_lead = $2)
		FROM usage_logs WHERE tenant_id = $1`, tn, parked[0].Lead).Scan(&compact, &full); err != nil {
		t.Fatal(err)
	}
	if compact != 2 || full != 2 {
		t.Errorf("%d logs stored without their accepted times (want the 2 pending), %d with them (want the 2 parked)", compact, full)
	}
	if c := counters(); c != [4]int64{0, 0, 4, 0} {
		t.Fatalf("counters after the acceptance (pending, under review, billed, other): %v", c)
	}
}

// Acceptance writes a log it bills, that nothing else changed, without
// the values the log would hold twice (migration 0073): an accepted time
// equal to billed_at and an output lead equal to the input lead are
// stored NULL, and every read gives them back. A dimension an earlier
// report accepted keeps its own time, and a dimension without overage
// stays without an event. The billed sums and the rollups find a late
// log's report, and so its day, through the output lead read back.
func TestABilledLogIsStoredWithoutWhatItRepeats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := worktest.New(t, worktest.Options{Tenants: []tenants.CreateParams{{StripeCustomerID: "cus_once"}}})
	tn := w.Tenants["cus_once"].ID
	store := usagelog.New(w.Pool)
	p := usagelog.FormParams{TenantID: tn, MaxLogs: 10, Lease: time.Minute, Guard: usagelog.GuardFor(24 * time.Hour)}
	usageDay := time.Now().UTC().AddDate(0, 0, -3)
	// late: reported at send time, so its reports carry the formation
	// time and Stripe bills it today, not on its usage day.
	late := worktest.Record(t, w.Ingest, tn, usageDay, 10, 4)
	if _, err := w.Pool.Exec(ctx, `UPDATE usage_logs SET stripe_timestamp = 'reported' WHERE id = $1`, late); err != nil {
		t.Fatal(err)
	}
	inOnly := worktest.Record(t, w.Ingest, tn, time.Now().Add(-time.Minute), 7, 0)
	first, err := store.Form(ctx, p)
	if err != nil || len(first) != 3 {
		t.Fatalf("first form: %+v %v", first, err)
	}
	if n, err := store.Accept(ctx, first...); err != nil || n != 2 {
		t.Fatalf("accept: %d logs, %v", n, err)
	}
	// partial: its input report is accepted in one transaction, its output
	// report in a later one, which bills it.
	partial := worktest.Record(t, w.Ingest, tn, time.Now().Add(-time.Minute), 5, 6)
	second, err := store.Form(ctx, p)
	if err != nil || len(second) != 2 {
		t.Fatalf("second form: %+v %v", second, err)
	}
	for _, d := range overage.Dimensions {
		for _, r := range second {
			if r.Dimension != d {
				continue
			}
			if _, err := store.Accept(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
	}

	type stored struct {
		inAt, outAt *time.Time
		outLead     *uuid.UUID
		billedAt    time.Time
		updatedAt   *time.Time
	}
	raw := func(id uuid.UUID) stored {
		t.Helper()
		var s stored
		if err := w.Pool.QueryRow(ctx, `SELECT input_accepted_at, output_accepted_at, output_report_lead, billed_at, updated_at
			FROM usage_logs WHERE id = $1 AND billing_status = 'billed'`, id).Scan(&s.inAt, &s.outAt, &s.outLead, &s.billedAt, &s.updatedAt); err != nil {
			t.Fatalf("log %s: %v", id, err)
		}
		return s
	}
	for name, id := range map[string]uuid.UUID{"late": late, "inOnly": inOnly} {
		if s := raw(id); s.inAt != nil || s.outAt != nil || s.outLead != nil || s.updatedAt != nil {
			t.Errorf("%s stored %+v: want both accepted times, the output lead and updated_at NULL", name, s)
		}
	}
	sp := raw(partial)
	if sp.inAt == nil || !sp.inAt.Before(sp.billedAt) || sp.outAt != nil || sp.outLead != nil {
		t.Errorf("partial stored %+v: want its input accepted before billed_at kept, the output's time and lead NULL", sp)
	}

	// What a reader sees: each dimension with overage carries its report's
	// identifier and the time Stripe accepted it.
	read := func(id uuid.UUID) (*overage.UsageLog, map[overage.Dimension]acceptedEvent) {
		t.Helper()
		l, err := w.Ingest.Get(ctx, id, &tn)
		if err != nil {
			t.Fatal(err)
		}
		got := map[overage.Dimension]acceptedEvent{}
		for _, e := range l.StripeEvents {
			if e.Identifier == nil || e.AcceptedAt == nil {
				t.Fatalf("log %s event %+v: want an identifier and an accepted time", id, e)
			}
			got[e.Dimension] = acceptedEvent{*e.Identifier, e.AcceptedAt.UTC()}
		}
		for _, m := range l.Meters {
			if m.Overage == 0 && (m.Identifier != nil || m.AcceptedAt != nil) {
				t.Errorf("log %s meter line %+v: no overage, yet an event", id, m)
			}
		}
		return l, got
	}
	key := overage.MeterEventKey
	l, got := read(late)
	billed := l.BilledAt.UTC()
	if want := (map[overage.Dimension]acceptedEvent{
		overage.DimensionInput:  {key(late, overage.DimensionInput), billed},
		overage.DimensionOutput: {key(late, overage.DimensionOutput), billed},
	}); !equalEvents(got, want) {
		t.Errorf("late read back %v, want %v", got, want)
	}
	l, got = read(inOnly)
	if want := (map[overage.Dimension]acceptedEvent{overage.DimensionInput: {key(inOnly, overage.DimensionInput), l.BilledAt.UTC()}}); !equalEvents(got, want) {
		t.Errorf("inOnly read back %v, want %v", got, want)
	}
	l, got = read(partial)
	if want := (map[overage.Dimension]acceptedEvent{
		overage.DimensionInput:  {key(partial, overage.DimensionInput), sp.inAt.UTC()},
		overage.DimensionOutput: {key(partial, overage.DimensionOutput), l.BilledAt.UTC()},
	}); !equalEvents(got, want) {
		t.Errorf("partial read back %v, want %v", got, want)
	}

	// The late log's output is billed on its report's day (today), found
	// through the output lead: with the lead read bare it would be on its
	// usage day.
	midnight := func(t time.Time) time.Time { return t.UTC().Truncate(24 * time.Hour) }
	sums, err := usagelog.Billed(ctx, w.Pool, usagelog.BilledParams{
		From: midnight(usageDay), End: midnight(time.Now()).AddDate(0, 0, 1), Cutoff: time.Now(), TenantIDs: []uuid.UUID{tn}})
	if err != nil {
		t.Fatal(err)
	}
	today := midnight(time.Now()).Format("2006-01-02")
	day := midnight(usageDay).Format("2006-01-02")
	if g := sums.Late[usagelog.BilledKey{Customer: "cus_once", Meter: "output", Day: today}]; g != 4 {
		t.Errorf("late output billed today: %d, want 4 (sums %v, late %v)", g, sums.Overage, sums.Late)
	}
	if g := sums.Overage[usagelog.BilledKey{Customer: "cus_once", Meter: "output", Day: day}]; g != 0 {
		t.Errorf("output billed on the usage day %s: %d, want 0", day, g)
	}

	// Rolling the month up puts that output on the same day (rolled back:
	// only the sums are looked at).
	tx, err := w.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var part string
	if err := tx.QueryRow(ctx, `SELECT tableoid::regclass::text FROM usage_logs WHERE id = $1`, late).Scan(&part); err != nil {
		t.Fatal(err)
	}
	if err := usagelog.RollUpTx(ctx, tx, usagelog.RollUp{Partition: part, Below: uuid.Max, BelowAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var rolledToday, rolledOnUsageDay int64
	if err := tx.QueryRow(ctx, `SELECT coalesce(sum(late_billed_tokens) FILTER (WHERE billing_day = $3::date), 0)::bigint,
			coalesce(sum(billed_tokens) FILTER (WHERE billing_day = $2::date), 0)::bigint
		FROM usage_rollups WHERE tenant_id = $1 AND meter = 'output'`, tn, day, today).Scan(&rolledToday, &rolledOnUsageDay); err != nil {
		t.Fatal(err)
	}
	if rolledToday != 4 || rolledOnUsageDay != 0 {
		t.Errorf("rolled up: late output billed today %d (want 4), on the usage day %d (want 0)", rolledToday, rolledOnUsageDay)
	}
}

// acceptedEvent is a meter event as a log shows it: its identifier and
// when Stripe accepted it.
type acceptedEvent struct {
	id string
	at time.Time
}

func equalEvents(a, b map[overage.Dimension]acceptedEvent) bool {
	if len(a) != len(b) {
		return false
	}
	for d, e := range a {
		if f, ok := b[d]; !ok || f.id != e.id || !f.at.Equal(e.at) {
			return false
		}
	}
	return true
}
