package reconcile_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/worktest"
	"github.com/overage-billing/overage/meters"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/reconcile"
	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/workers"
)

const (
	secretKey = "sk_test_123"
	inMeter   = "llm_input_tokens"
	outMeter  = "llm_output_tokens"
	// settled judges every window that has ended: the clean run's billing
	// happened before the run, so no row is too recent for activity.
	settled = time.Nanosecond
)

// fixture is a database and an emulator after a clean run of the real
// pipeline: usage ingested through ingest.Service, billed by the real
// workers through stripeclient into the emulator over HTTP.
type fixture struct {
	pool    *pgxpool.Pool
	emu     *emulator.Emulator
	base    string
	sc      *stripeclient.Client
	reader  *stripeclient.SummaryClient
	ingest  *ingest.Service
	tenants map[string]*tenants.Created // by Stripe customer id

	today, yesterday time.Time
	day              func(time.Time) string
}

func newFixture(t *testing.T, opts emulator.Options, before ...func(*pgxpool.Pool)) *fixture {
	t.Helper()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	emu := emulator.New(opts)
	t.Cleanup(emu.Close)
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sc, err := stripeclient.New(stripeclient.Config{SecretKey: secretKey, APIBase: base, RateLimit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := stripeclient.NewSummaryReader(stripeclient.Config{SecretKey: secretKey, APIBase: base, RateLimit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	f := &fixture{
		pool: pool, emu: emu, base: base, sc: sc, reader: reader,
		ingest:  ingest.NewService(pool, outbox.NewInserter(rc, outbox.DefaultMaxAttempts)),
		tenants: map[string]*tenants.Created{},
		today:   today, yesterday: today.Add(-24 * time.Hour),
		day: func(d time.Time) string { return d.Format(reconcile.DayLayout) },
	}
	for _, c := range []struct {
		cus     string
		in, out int64
	}{{"cus_a", 0, 0}, {"cus_b", 0, 0}, {"cus_capped", 500, 0}, {"cus_free", 1000, 1000}} {
		tn, err := tenants.NewStore(pool).Create(ctx, tenants.CreateParams{
			Name: "tenant " + c.cus, StripeCustomerID: c.cus, IncludedInputTokens: c.in, IncludedOutputTokens: c.out,
		})
		if err != nil {
			t.Fatal(err)
		}
		f.tenants[c.cus] = tn
	}

	f.ingest.SetPeriodCloseGrace(fixtureGrace)
	for _, b := range before {
		b(pool)
	}
	y, d := f.yesterday, f.today
	ids := []uuid.UUID{
		f.record(t, "cus_a", y.Add(12*time.Hour), 100, 10),
		f.record(t, "cus_a", d.Add(-time.Second), 50, 0), // the last second of yesterday
		f.record(t, "cus_a", d, 7, 3),                    // the first second of today
		f.record(t, "cus_b", y.Add(6*time.Hour), 200, 20),
		f.record(t, "cus_b", d, 1, 1),
		f.record(t, "cus_capped", y.Add(time.Hour), 300, 5), // input within the allowance
		f.record(t, "cus_capped", y.Add(2*time.Hour), 300, 5),
	}
	// Not billable on the default meters, within its allowance: never
	// sent, never counted. A meter made by before may have no allowance
	// (allowances are per meter), and then the log is billable: the
	// workers must bill it before they stop too, or a report of it may be
	// accepted by Stripe and stopped before its log is marked billed.
	free := f.record(t, "cus_free", y.Add(time.Hour), 10, 10)
	var status overage.BillingStatus
	if err := pool.QueryRow(ctx, "SELECT billing_status FROM usage_logs WHERE id = $1", free).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != overage.BillingStatusNotBillable {
		ids = append(ids, free)
	}

	f.runWorkersGrace(t, fixtureGrace, ids)
	return f
}

// fixtureGrace is the fixture's PERIOD_CLOSE_GRACE: long enough that
// yesterday's usage keeps its usage timestamp on the first of a month.
const fixtureGrace = 40 * 24 * time.Hour

// record ingests one usage event through the real ingest transaction.
func (f *fixture) record(t *testing.T, customer string, ts time.Time, in, out int64) uuid.UUID {
	t.Helper()
	return worktest.Record(t, f.ingest, f.tenants[customer].ID, ts, in, out)
}

// runWorkers runs the real workers until every id is billed, then stops
// them, so the reconcile run sees a still pipeline.
func (f *fixture) runWorkers(t *testing.T, ids []uuid.UUID) {
	t.Helper()
	f.runWorkersGrace(t, fixtureGrace, ids)
}

// runWorkersGrace is runWorkers with PERIOD_CLOSE_GRACE grace.
func (f *fixture) runWorkersGrace(t *testing.T, grace time.Duration, ids []uuid.UUID) {
	t.Helper()
	w, err := workers.New(f.pool, workers.Config{Stripe: f.sc, SweepInterval: time.Hour, PeriodCloseGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("workers stopped with %v", err)
		}
	}()
	polltest.Until(t, fmt.Sprintf("%d usage logs billed", len(ids)), 30*time.Second, func() bool {
		var unbilled int
		if err := f.pool.QueryRow(context.Background(), "SELECT count(*) FROM usage_logs WHERE id = ANY($1) AND billing_status <> $2",
			ids, overage.BillingStatusBilled).Scan(&unbilled); err != nil {
			t.Fatal(err)
		}
		return unbilled == 0
	})
}

// billInDatabaseOnly records a usage log and marks it billed in SQL at
// billedAt, as if Stripe had accepted it, without sending anything.
func (f *fixture) billInDatabaseOnly(t *testing.T, customer string, ts time.Time, in, out int64, billedAt string) uuid.UUID {
	t.Helper()
	id := f.record(t, customer, ts, in, out)
	if _, err := f.pool.Exec(context.Background(), `UPDATE usage_logs SET billing_status = 'billed',
		first_attempt_at = `+billedAt+`, billed_at = `+billedAt+`,
		input_accepted_at = CASE WHEN coalesce(overage_input_tokens, input_tokens) > 0 THEN `+billedAt+` END,
		output_accepted_at = CASE WHEN coalesce(overage_output_tokens, output_tokens) > 0 THEN `+billedAt+` END
		WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	return id
}

func (f *fixture) run(t *testing.T, p reconcile.Params) *reconcile.Result {
	t.Helper()
	if p.From.IsZero() {
		p.From, p.To = f.yesterday, f.today
	}
	res, err := reconcile.Run(context.Background(), f.pool, f.reader, p)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

func rowsOf(res *reconcile.Result, status reconcile.Status) []reconcile.Row {
	var out []reconcile.Row
	for _, r := range res.Rows {
		if r.Status == status {
			out = append(out, r)
		}
	}
	return out
}

func dumpRows(res *reconcile.Result) string {
	var b strings.Builder
	for _, r := range res.Rows {
		fmt.Fprintf(&b, "\n  %+v", r)
	}
	return b.String()
}

func TestCleanRunMatchesThenNamesTheUnappliedLog(t *testing.T) {
	t.Parallel()
	f := newFixture(t, emulator.Options{})
	y, d := f.day(f.yesterday), f.day(f.today)

	// (a) After a clean run every judged window matches; today is too
	// recent, since its window has not ended.
	res := f.run(t, reconcile.Params{SettleAfter: settled})
	want := map[string]reconcile.Row{}
	for _, r := range []reconcile.Row{
		{Customer: "cus_a", Meter: inMeter, Day: y, Database: 150, Stripe: 150, Status: reconcile.StatusMatch},
		{Customer: "cus_a", Meter: outMeter, Day: y, Database: 10, Stripe: 10, Status: reconcile.StatusMatch},
		{Customer: "cus_b", Meter: inMeter, Day: y, Database: 200, Stripe: 200, Status: reconcile.StatusMatch},
		{Customer: "cus_b", Meter: outMeter, Day: y, Database: 20, Stripe: 20, Status: reconcile.StatusMatch},
		{Customer: "cus_capped", Meter: inMeter, Day: y, Database: 100, Stripe: 100, Status: reconcile.StatusMatch},
		{Customer: "cus_capped", Meter: outMeter, Day: y, Database: 10, Stripe: 10, Status: reconcile.StatusMatch},
		{Customer: "cus_a", Meter: inMeter, Day: d, Database: 7, Stripe: 7, Status: reconcile.StatusTooRecent, Reason: reconcile.ReasonWindowOpen},
		{Customer: "cus_a", Meter: outMeter, Day: d, Database: 3, Stripe: 3, Status: reconcile.StatusTooRecent, Reason: reconcile.ReasonWindowOpen},
		{Customer: "cus_b", Meter: inMeter, Day: d, Database: 1, Stripe: 1, Status: reconcile.StatusTooRecent, Reason: reconcile.ReasonWindowOpen},
		{Customer: "cus_b", Meter: outMeter, Day: d, Database: 1, Stripe: 1, Status: reconcile.StatusTooRecent, Reason: reconcile.ReasonWindowOpen},
	} {
		want[r.Customer+"|"+r.Meter+"|"+r.Day] = r
	}
	if len(res.Rows) != len(want) {
		t.Fatalf("%d rows, want %d:%s", len(res.Rows), len(want), dumpRows(res))
	}
	for _, r := range res.Rows {
		if w, ok := want[r.Customer+"|"+r.Meter+"|"+r.Day]; !ok || r != w {
			t.Errorf("row %+v, want %+v", r, w)
		}
	}
	if !res.OK() || res.Matches != 6 || res.Differences != 0 || res.TooRecent != 4 || res.TooRecentFrom != d {
		t.Fatalf("clean run: OK %v, %d matches, %d differences, %d too recent (from %q)%s",
			res.OK(), res.Matches, res.Differences, res.TooRecent, res.TooRecentFrom, dumpRows(res))
	}
	if len(res.Customers) != 4 || len(res.Meters) != 2 ||
		len(res.Meters[0].MeterIDs) != 1 || res.Meters[0].MeterIDs[0] != f.emu.MeterID(inMeter) {
		t.Errorf("scope: customers %+v, meters %+v", res.Customers, res.Meters)
	}

	// (b) One more log billed in the database, never sent: exactly one
	// difference, naming its customer, meter and day, with the numbers.
	f.billInDatabaseOnly(t, "cus_b", f.yesterday.Add(18*time.Hour), 40, 0, "now()")
	res = f.run(t, reconcile.Params{SettleAfter: settled})
	diffs := rowsOf(res, reconcile.StatusDifference)
	wantDiff := reconcile.Row{Customer: "cus_b", Meter: inMeter, Day: y, Database: 240, Stripe: 200, Delta: -40, Status: reconcile.StatusDifference}
	if res.OK() || res.Differences != 1 || len(diffs) != 1 || diffs[0] != wantDiff || res.Rows[0] != wantDiff {
		t.Fatalf("after a log billed only in the database: OK %v, differences %+v, want exactly %+v%s", res.OK(), diffs, wantDiff, dumpRows(res))
	}
	if res.Matches != 5 || res.TooRecent != 4 {
		t.Errorf("%d matches, %d too recent; want 5 and 4", res.Matches, res.TooRecent)
	}

	var buf bytes.Buffer
	if err := reconcile.WriteText(&buf, res); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	t.Logf("result:\n%s", text)
	lines := strings.Split(text, "\n")
	if !strings.HasPrefix(lines[1], "STATUS") ||
		!regexp.MustCompile(`^difference\s+cus_b\s+llm_input_tokens\s+`+y+`\s+240\s+200\s+-40\s+billed in the database, not applied at Stripe$`).MatchString(lines[2]) {
		t.Errorf("the first row of the table is not the difference:\n%s", text)
	}
	if !strings.Contains(text, "DIFFERENT: the database and Stripe disagree: 1 difference(s), 5 match(es), 4 too recent to judge\n") ||
		!strings.Contains(text, "every day from "+d) {
		t.Errorf("summary or too-recent line missing:\n%s", text)
	}

	js, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var decoded struct {
		Rows []map[string]any `json:"rows"`
		reconcile.Result
	}
	if err := json.Unmarshal(js, &decoded); err != nil {
		t.Fatal(err)
	}
	if r := decoded.Rows[0]; r["customer"] != "cus_b" || r["meter"] != inMeter || r["day"] != y ||
		r["database"] != 240.0 || r["stripe"] != 200.0 || r["stripe_minus_database"] != -40.0 || r["status"] != "difference" ||
		decoded.Differences != 1 || decoded.SettleAfterText != "1ns" || decoded.TooRecentFrom != d {
		t.Errorf("JSON: %s", js)
	}

	// And the other way round: Stripe took an event for a log the database
	// does not count as billed (a needs_review log whose send landed).
	id := f.record(t, "cus_a", f.yesterday.Add(8*time.Hour), 25, 0)
	if _, err := f.pool.Exec(context.Background(), `UPDATE usage_logs SET billing_status = 'needs_review',
		first_attempt_at = now() - interval '30 hours' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := f.sc.SendMeterEvent(context.Background(), stripeclient.MeterEvent{
		EventName: inMeter, CustomerID: "cus_a", Value: 25, Timestamp: f.yesterday.Add(8 * time.Hour),
		Key: overage.MeterEventKey(id, overage.DimensionInput),
	}); err != nil {
		t.Fatal(err)
	}
	res = f.run(t, reconcile.Params{SettleAfter: settled})
	diffs = rowsOf(res, reconcile.StatusDifference)
	extra := reconcile.Row{Customer: "cus_a", Meter: inMeter, Day: y, Database: 150, Stripe: 175, Delta: 25, Status: reconcile.StatusDifference}
	if res.Differences != 2 || len(diffs) != 2 || diffs[0] != extra || diffs[1] != wantDiff {
		t.Fatalf("after an event Stripe took for a needs_review log: differences %+v, want %+v and %+v", diffs, extra, wantDiff)
	}
}

func TestTooRecentWindowsAreNotDifferences(t *testing.T) {
	t.Parallel()
	f := newFixture(t, emulator.Options{})
	y := f.day(f.yesterday)
	f.billInDatabaseOnly(t, "cus_b", f.yesterday.Add(18*time.Hour), 40, 0, "now() - interval '3 hours'")

	// A settle time covering yesterday and today: nothing can be judged,
	// so the unapplied log is reported too recent, not different.
	res := f.run(t, reconcile.Params{SettleAfter: 48 * time.Hour})
	if !res.OK() || res.Differences != 0 || res.Matches != 0 || res.TooRecent != len(res.Rows) || res.TooRecentFrom != y {
		t.Fatalf("OK %v, %d differences, %d matches, %d too recent of %d rows, from %q%s",
			res.OK(), res.Differences, res.Matches, res.TooRecent, len(res.Rows), res.TooRecentFrom, dumpRows(res))
	}
	found := false
	for _, r := range res.Rows {
		if r.Customer == "cus_b" && r.Meter == inMeter && r.Day == y {
			found = r.Database == 240 && r.Stripe == 200 && r.Reason == reconcile.ReasonWindowOpen
		}
	}
	if !found {
		t.Errorf("the unapplied window is not reported too recent with its numbers:%s", dumpRows(res))
	}
	var buf bytes.Buffer
	if err := reconcile.WriteText(&buf, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "NOT JUDGED: nothing could be compared yet: 0 difference(s), 0 match(es), 10 too recent to judge") ||
		!strings.Contains(buf.String(), "every day from "+y) {
		t.Errorf("text:\n%s", buf.String())
	}

	// Usage may arrive up to 35 days late: a window long over is still too
	// recent while its billing is, and judged once that has settled.
	old := f.today.Add(-3 * 24 * time.Hour)
	id := f.billInDatabaseOnly(t, "cus_a", old.Add(time.Hour), 30, 0, "now()")
	p := reconcile.Params{From: old, To: old, SettleAfter: time.Hour}
	res = f.run(t, p)
	want := reconcile.Row{Customer: "cus_a", Meter: inMeter, Day: f.day(old), Database: 30, Stripe: 0, Delta: -30,
		Status: reconcile.StatusTooRecent, Reason: reconcile.ReasonRecentActivity}
	if len(res.Rows) != 1 || res.Rows[0] != want || !res.OK() || res.TooRecentFrom != "" {
		t.Fatalf("recently billed old window: %+v, want %+v", res.Rows, want)
	}
	buf.Reset()
	if err := reconcile.WriteText(&buf, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "cus_a "+f.day(old)+" (billing activity after the cutoff)") {
		t.Errorf("text does not name the recent window:\n%s", buf.String())
	}
	if _, err := f.pool.Exec(context.Background(), `UPDATE usage_logs SET first_attempt_at = now() - interval '2 hours',
		input_accepted_at = now() - interval '2 hours', billed_at = now() - interval '2 hours' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	res = f.run(t, p)
	want.Status, want.Reason = reconcile.StatusDifference, ""
	if len(res.Rows) != 1 || res.Rows[0] != want || res.OK() {
		t.Fatalf("settled old window: %+v, want %+v", res.Rows, want)
	}
}

func TestTenantFilterLimitsTheScope(t *testing.T) {
	t.Parallel()
	f := newFixture(t, emulator.Options{})
	f.billInDatabaseOnly(t, "cus_b", f.yesterday.Add(18*time.Hour), 40, 0, "now()")
	// Stripe usage of a customer no tenant of the scope has: out of scope.
	if _, err := f.sc.SendMeterEvent(context.Background(), stripeclient.MeterEvent{
		EventName: inMeter, CustomerID: "cus_stranger", Value: 9, Timestamp: f.yesterday, Key: "stranger-1",
	}); err != nil {
		t.Fatal(err)
	}

	a := f.tenants["cus_a"].ID
	res := f.run(t, reconcile.Params{TenantID: &a, SettleAfter: settled})
	if !res.OK() || res.Matches != 2 || res.TooRecent != 2 || len(res.Customers) != 1 ||
		res.Customers[0].StripeCustomerID != "cus_a" || len(res.Customers[0].Tenants) != 1 || res.Customers[0].Tenants[0].ID != a {
		t.Fatalf("tenant cus_a: OK %v, customers %+v%s", res.OK(), res.Customers, dumpRows(res))
	}
	for _, r := range res.Rows {
		if r.Customer != "cus_a" {
			t.Errorf("row of another customer: %+v", r)
		}
	}

	b := f.tenants["cus_b"].ID
	res = f.run(t, reconcile.Params{TenantID: &b, SettleAfter: settled})
	if res.OK() || res.Differences != 1 || res.Rows[0].Customer != "cus_b" || res.Rows[0].Delta != -40 {
		t.Fatalf("tenant cus_b: %s", dumpRows(res))
	}

	// Without a filter every tenant's customer is in scope; a customer no
	// tenant has is not (its usage is another system's business).
	res = f.run(t, reconcile.Params{SettleAfter: settled})
	if res.Differences != 1 || len(res.Customers) != 4 {
		t.Fatalf("all tenants: %d differences, customers %+v", res.Differences, res.Customers)
	}
	for _, r := range res.Rows {
		if r.Customer == "cus_stranger" {
			t.Errorf("a customer without a tenant was reconciled: %+v", r)
		}
	}

	unknown := uuid.New()
	if _, err := reconcile.Run(context.Background(), f.pool, f.reader, reconcile.Params{From: f.yesterday, To: f.today, TenantID: &unknown}); err == nil ||
		!strings.Contains(err.Error(), unknown.String()) {
		t.Errorf("unknown tenant: %v", err)
	}
}

func TestPaginationOfMetersAndSummaries(t *testing.T) {
	t.Parallel()
	// Three more meters than the pipeline uses, so the meters list spans
	// pages too.
	f := newFixture(t, emulator.Options{Meters: []string{"llm_cached_tokens", "images", "seconds"}})
	from := f.today.Add(-4 * 24 * time.Hour)
	now := time.Now()
	p := reconcile.Params{From: from, To: f.today, SettleAfter: settled, Now: now}

	whole, err := reconcile.Run(context.Background(), f.pool, f.reader, p)
	if err != nil {
		t.Fatal(err)
	}
	countGets := func() (meters, summaries int) {
		for _, r := range f.emu.Requests() {
			switch {
			case r.Method == "GET" && r.Path == "/v1/billing/meters":
				meters++
			case r.Method == "GET" && strings.HasSuffix(r.Path, "/event_summaries"):
				summaries++
			}
		}
		return meters, summaries
	}
	m0, s0 := countGets()

	paged, err := reconcile.Run(context.Background(), f.pool, f.reader.WithPageSize(1), p)
	if err != nil {
		t.Fatal(err)
	}
	m1, s1 := countGets()
	// One page per meter (5 meters); one page per day window (5 days) for
	// each of the 4 customers and 2 meters.
	if m1-m0 != 5 || s1-s0 != 4*2*5 {
		t.Errorf("page size 1: %d meters pages, %d summaries pages; want 5 and 40 (page size 100: %d and %d)", m1-m0, s1-s0, m0, s0)
	}
	if m0 != 1 || s0 != 4*2 {
		t.Errorf("page size 100: %d meters pages, %d summaries pages; want 1 and 8", m0, s0)
	}
	a, _ := json.Marshal(whole)
	b, _ := json.Marshal(paged)
	if !bytes.Equal(a, b) {
		t.Fatalf("paged result differs:\n%s\n%s", a, b)
	}
	if !paged.OK() || paged.Matches != 6 || paged.TooRecent != 4 {
		t.Fatalf("paged: %s", dumpRows(paged))
	}
}

func TestMissingMeterMakesEveryBilledWindowADifference(t *testing.T) {
	t.Parallel()
	f := newFixture(t, emulator.Options{})
	res := f.run(t, reconcile.Params{MeterOutputEvent: "llm_output_tokenz", SettleAfter: settled})
	if res.OK() || res.Differences != 3 || len(res.Meters[1].MeterIDs) != 0 {
		t.Fatalf("misnamed output meter: %d differences, meters %+v%s", res.Differences, res.Meters, dumpRows(res))
	}
	for _, r := range rowsOf(res, reconcile.StatusDifference) {
		if r.Meter != "llm_output_tokenz" || r.Stripe != 0 || r.Database <= 0 {
			t.Errorf("difference %+v", r)
		}
	}
	var buf bytes.Buffer
	if err := reconcile.WriteText(&buf, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `warning: Stripe has no meter with event name "llm_output_tokenz"`) {
		t.Errorf("text:\n%s", buf.String())
	}
}

func TestParamsAreValidated(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	emu := emulator.New(emulator.Options{})
	t.Cleanup(emu.Close)
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reader, err := stripeclient.NewSummaryReader(stripeclient.Config{SecretKey: secretKey, APIBase: base})
	if err != nil {
		t.Fatal(err)
	}
	day := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	for name, p := range map[string]reconcile.Params{
		"no days":         {},
		"from after to":   {From: day, To: day.Add(-24 * time.Hour)},
		"negative settle": {From: day, To: day, SettleAfter: -time.Hour},
		"one meter twice": {From: day, To: day, MeterInputEvent: "x", MeterOutputEvent: "x"},
	} {
		if _, err := reconcile.Run(context.Background(), pool, reader, p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if len(emu.Requests()) != 0 {
		t.Errorf("invalid parameters reached Stripe")
	}

	// An empty database against an empty Stripe: nothing to compare, OK,
	// and the days are inclusive and truncated to UTC days.
	res, err := reconcile.Run(context.Background(), pool, reader, reconcile.Params{
		From: day.Add(13 * time.Hour), To: day.Add(25 * time.Hour), Now: day.Add(30 * 24 * time.Hour),
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK() || len(res.Rows) != 0 || res.From != "2026-11-29" || res.To != "2026-11-30" || res.TooRecentFrom != "" {
		t.Fatalf("empty: %+v", res)
	}

	for _, tc := range []struct {
		in   string
		want time.Time
		ok   bool
	}{{"2026-11-29", day, true}, {" 2026-11-29 ", day, true}, {"2026-11-31", time.Time{}, false}, {"29.11.2026", time.Time{}, false}} {
		got, err := reconcile.ParseDay(tc.in)
		if (err == nil) != tc.ok || !got.Equal(tc.want) {
			t.Errorf("ParseDay(%q) = %v, %v", tc.in, got, err)
		}
	}
}

// Usage on a meter other than the defaults is reconciled under its event
// name: the fixture's output tokens (model "m") all go to a per-model
// meter, and its rows match Stripe's where the default output meter's
// used to.
func TestMetersAreReconciledByTheirEventNames(t *testing.T) {
	t.Parallel()
	store := func(pool *pgxpool.Pool) *meters.Store { return meters.NewStore(pool, inMeter, outMeter) }
	f := newFixture(t, emulator.Options{}, func(pool *pgxpool.Pool) {
		if _, err := store(pool).Create(context.Background(), meters.CreateParams{
			Key: "m_output", EventName: "m_output_tokens", TokenType: overage.TokenOutput, Models: []string{"m"}}); err != nil {
			t.Fatal(err)
		}
	})
	ms, err := store(f.pool).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	res := f.run(t, reconcile.Params{SettleAfter: settled, Meters: ms})
	y := f.day(f.yesterday)
	got := map[string]reconcile.Row{}
	for _, r := range res.Rows {
		got[r.Customer+"|"+r.Meter+"|"+r.Day] = r
		if r.Meter == outMeter {
			t.Errorf("a row on the default output meter, which took nothing: %+v", r)
		}
	}
	// cus_free's output allowance is the default output meter's; m_output
	// has none, so its 10 output tokens are billed there.
	for cus, want := range map[string]int64{"cus_a": 10, "cus_b": 20, "cus_capped": 10, "cus_free": 10} {
		r := got[cus+"|m_output_tokens|"+y]
		if r.Status != reconcile.StatusMatch || r.Database != want || r.Stripe != want {
			t.Errorf("%s m_output_tokens %s: %+v, want a match of %d", cus, y, r, want)
		}
	}
	if !res.OK() || len(res.Meters) != 3 {
		t.Fatalf("OK %v, meters %+v%s", res.OK(), res.Meters, dumpRows(res))
	}
}

// A log of a period closed when it was reported is billed by Stripe on the
// day of its report, not its usage day: the database side counts it there
// too, so both days match, and the text says the row holds late usage.
func TestUsageReportedLateIsMatchedOnItsBillingDay(t *testing.T) {
	t.Parallel()
	f := newFixture(t, emulator.Options{})
	ctx := context.Background()
	tn, err := tenants.NewStore(f.pool).Create(ctx, tenants.CreateParams{Name: "tenant cus_late", StripeCustomerID: "cus_late"})
	if err != nil {
		t.Fatal(err)
	}
	// Its previous subscription period ended 3 h ago: past the grace.
	end := time.Now().Add(-3 * time.Hour)
	if _, err := f.pool.Exec(ctx, `INSERT INTO tenant_subscriptions (tenant_id, stripe_subscription_id, status, current_period_start, current_period_end, event_created)
		VALUES ($1, 'sub_old', 'active', $2, $3, now()), ($1, 'sub_new', 'active', $3, $4, now())`,
		tn.ID, end.Add(-30*24*time.Hour), end, end.Add(30*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	usage := time.Now().Add(-50 * time.Hour)
	id := worktest.Record(t, f.ingest, tn.ID, usage, 60, 4)
	f.runWorkersGrace(t, time.Hour, []uuid.UUID{id})
	var basis string
	if err := f.pool.QueryRow(ctx, `SELECT stripe_timestamp FROM usage_logs WHERE id = $1`, id).Scan(&basis); err != nil || basis != "reported" {
		t.Fatalf("the late log's stripe_timestamp: %q, %v; want reported", basis, err)
	}

	// Judged a day later, so today's window (where Stripe has it) has ended.
	res := f.run(t, reconcile.Params{From: usage, To: f.today, Now: f.today.Add(25 * time.Hour), SettleAfter: settled})
	if !res.OK() || res.TooRecent != 0 {
		t.Fatalf("a late log: OK %v, %d differences, %d too recent%s", res.OK(), res.Differences, res.TooRecent, dumpRows(res))
	}
	want := map[string]reconcile.Row{
		inMeter:  {Customer: "cus_late", Meter: inMeter, Day: f.day(f.today), Database: 60, Stripe: 60, ReportedLate: 60, Status: reconcile.StatusMatch},
		outMeter: {Customer: "cus_late", Meter: outMeter, Day: f.day(f.today), Database: 4, Stripe: 4, ReportedLate: 4, Status: reconcile.StatusMatch},
	}
	n := 0
	for _, r := range res.Rows {
		if r.Customer != "cus_late" {
			continue
		}
		n++
		if r != want[r.Meter] {
			t.Errorf("row %+v, want %+v", r, want[r.Meter])
		}
	}
	if n != 2 {
		t.Fatalf("%d rows of cus_late, want 2 (today's, none on its usage day)%s", n, dumpRows(res))
	}
	var buf bytes.Buffer
	if err := reconcile.WriteText(&buf, res); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`match\s+cus_late\s+llm_input_tokens\s+` + f.day(f.today) + `\s+60\s+60\s+0\s+database includes 60 of earlier days' usage, reported late`).MatchString(buf.String()) {
		t.Errorf("the text does not explain the late row:\n%s", buf.String())
	}
}
