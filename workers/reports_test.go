package workers_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/worktest"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/workers"
)

// requestsOf returns every request Stripe received with the report's key,
// failing t unless each carried the key as both the Idempotency-Key and
// the identifier, and the report's value. (A replayed answer also proves
// the same timestamp: the emulator refuses a key reused with any other
// parameter.)
func requestsOf(t *testing.T, b *bundle, r report, d overage.Dimension) []emulator.Request {
	t.Helper()
	var out []emulator.Request
	for _, q := range b.Emu.Requests() {
		if q.IdempotencyKey != r.key(d) && q.Identifier != r.key(d) {
			continue
		}
		if q.IdempotencyKey != q.Identifier || q.Value != r.value {
			t.Fatalf("request %+v for report %s worth %d", q, r.key(d), r.value)
		}
		if q.Outcome == emulator.OutcomeIdempotencyError {
			t.Fatalf("the report was resent with other parameters: %+v", q)
		}
		out = append(out, q)
	}
	return out
}

func sameReport(a, b report) bool {
	return a.lead == b.lead && a.value == b.value && a.ts.Equal(b.ts) && slices.Equal(a.members, b.members)
}

// A report's key, value, timestamp and members are fixed when it is
// formed: a lost answer, a River retry meeting a 500 and a restart of the
// workers all resend the same event, which Stripe applies once.
func TestReportIsTheSameEventAcrossRetriesAndARestart(t *testing.T) {
	t.Parallel()
	b := setup(t, emulator.Faults{LostResponseRate: 1})
	var ids []uuid.UUID
	for i := range 5 {
		ids = append(ids, b.Record(t, "cus_a", int64(10+i), 0))
	}
	stop := b.Start(t, workers.Config{})
	polltest.Until(t, "the lost answer", 20*time.Second, func() bool { return len(b.Emu.Requests()) >= 1 })
	formed := b.reportOf(t, ids[0], overage.DimensionInput)
	if formed.lead != ids[0] || !slices.Equal(formed.members, ids) || formed.value != 60 {
		t.Fatalf("report %+v, want the five logs led by the oldest, worth 60", formed)
	}
	b.Emu.SetFaults(emulator.Faults{ServerErrorRate: 1})
	polltest.Until(t, "a River retry", 20*time.Second, func() bool { return len(requestsOf(t, b, formed, overage.DimensionInput)) >= 2 })
	stop()
	b.Emu.SetFaults(emulator.Faults{})
	b.Start(t, workers.Config{})
	for _, id := range ids {
		b.waitStatus(t, id, overage.BillingStatusBilled, 30*time.Second)
	}
	if after := b.reportOf(t, ids[4], overage.DimensionInput); !sameReport(formed, after) || after.state != "accepted" {
		t.Fatalf("report changed: formed %+v, billed %+v", formed, after)
	}
	reqs := requestsOf(t, b, formed, overage.DimensionInput)
	if len(reqs) < 3 || reqs[0].Outcome != emulator.OutcomeLostResponse || reqs[len(reqs)-1].Outcome != emulator.OutcomeReplayed {
		t.Fatalf("requests %+v, want the lost one, a retry, and Stripe's replay after the restart", reqs)
	}
	if n := len(b.Emu.Requests()); n != len(reqs) {
		t.Fatalf("%d calls, %d of them for the report: no other event may exist", n, len(reqs))
	}
	requireAppliedEqualsBilled(t, b)
}

// A job discarded after a lost answer (and its follow-up's 500s) leaves
// its report formed and open.
// The sweep's job sends that report again with its own members and key
// (Stripe replays it), and logs recorded since form a new report.
func TestSweepResendsAFormedReportAndFormsANewOneForNewLogs(t *testing.T) {
	t.Parallel()
	b := setupAttempts(t, emulator.Faults{LostResponseRate: 1}, 1)
	first := []uuid.UUID{b.Record(t, "cus_b", 40, 2), b.Record(t, "cus_b", 1, 1)}
	// One job (the two logs may have fallen in two batch periods; either
	// job reports both), with one attempt.
	if jobs := reportJobs(t, b.River); len(jobs) > 1 {
		var later []int64
		for _, j := range jobs[1:] {
			later = append(later, j.ID)
		}
		if _, err := b.River.JobDeleteMany(context.Background(), river.NewJobDeleteManyParams().IDs(later...)); err != nil {
			t.Fatal(err)
		}
	}
	stop := b.Start(t, workers.Config{MaxAttempts: 1, RoundTries: 1})
	b.loseThenFail(t, 2)
	polltest.Until(t, "the job to be discarded", 20*time.Second, func() bool { return countJobs(t, b.River, rivertype.JobStateDiscarded) == 1 })
	stop()
	formed := b.reportOf(t, first[0], overage.DimensionInput)
	if s, _ := b.status(t, first[0]); s != overage.BillingStatusPending || formed.state != "open" {
		t.Fatalf("after the discard: log %s, report %+v; want pending and open", s, formed)
	}
	// No workers now: these logs' job waits. They are in no report yet.
	later := []uuid.UUID{b.Record(t, "cus_b", 5, 0), b.Record(t, "cus_b", 6, 0)}
	if _, err := b.River.JobDeleteMany(context.Background(), river.NewJobDeleteManyParams().Kinds(outbox.ReportArgs{}.Kind()).
		States(rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable, rivertype.JobStateScheduled)); err != nil {
		t.Fatal(err)
	}
	b.Emu.SetFaults(emulator.Faults{})
	b.Start(t, workers.Config{SweepInterval: 200 * time.Millisecond, SweepGrace: time.Millisecond})
	for _, id := range append(first, later...) {
		b.waitStatus(t, id, overage.BillingStatusBilled, 20*time.Second)
	}
	if after := b.reportOf(t, first[1], overage.DimensionInput); !sameReport(formed, after) {
		t.Fatalf("the requeued report changed: %+v, then %+v", formed, after)
	}
	for _, d := range overage.Dimensions {
		reqs := requestsOf(t, b, b.reportOf(t, first[0], d), d)
		if len(reqs) < 2 || reqs[0].Outcome != emulator.OutcomeLostResponse || reqs[len(reqs)-1].Outcome != emulator.OutcomeReplayed {
			t.Fatalf("%s: %+v, want the lost send, the follow-up's 500s and the replay", d, reqs)
		}
		for _, q := range reqs[1 : len(reqs)-1] {
			if q.Outcome != emulator.OutcomeFaultServerError {
				t.Fatalf("%s: %+v, want only 500s between the lost send and the replay", d, reqs)
			}
		}
	}
	next := b.reportOf(t, later[0], overage.DimensionInput)
	if next.lead != later[0] || !slices.Equal(next.members, later) || next.value != 11 {
		t.Fatalf("report of the later logs %+v, want both, led by the first, worth 11", next)
	}
	requireAppliedEqualsBilled(t, b)
}

// Logs recorded while a report is on its way to Stripe are not added to
// it: they go to the next report, with a key of their own.
func TestLogsArrivingWhileAReportIsInFlightGoToTheNextReport(t *testing.T) {
	t.Parallel()
	b := setup(t, emulator.Faults{Latency: 1500 * time.Millisecond})
	first := []uuid.UUID{b.Record(t, "cus_a", 10, 1), b.Record(t, "cus_a", 20, 2)}
	b.Start(t, workers.Config{})
	polltest.Until(t, "the first report in flight", 20*time.Second, func() bool {
		for _, r := range b.Emu.Requests() {
			if r.Outcome == emulator.OutcomePending {
				return true
			}
		}
		return false
	})
	later := []uuid.UUID{b.Record(t, "cus_a", 30, 3), b.Record(t, "cus_a", 40, 4)}
	for _, id := range append(first, later...) {
		b.waitStatus(t, id, overage.BillingStatusBilled, 20*time.Second)
	}
	// The later logs are usually one report; two when a batch period
	// (200 ms here) ends between their two transactions, as it may on a
	// loaded machine. Either way none joins the report in flight.
	reports := 0
	for _, d := range overage.Dimensions {
		a := b.reportOf(t, first[0], d)
		if !slices.Equal(a.members, first) {
			t.Fatalf("%s: first report %+v, want only the first logs", d, a)
		}
		leads := map[uuid.UUID]bool{a.lead: true}
		for _, id := range later {
			n := b.reportOf(t, id, d)
			if slices.ContainsFunc(n.members, func(m uuid.UUID) bool { return !slices.Contains(later, m) }) {
				t.Fatalf("%s: first report %+v, later log's %+v: want only later logs in it", d, a, n)
			}
			leads[n.lead] = true
		}
		reports += len(leads)
	}
	if n := len(b.Emu.Requests()); n != reports {
		t.Fatalf("%d calls, want one for each of the %d reports", n, reports)
	}
	requireAppliedEqualsBilled(t, b)
}

// A dimension's report gathers only the logs with overage in it; a log is
// billed when the reports of all its dimensions with overage are accepted.
func TestReportOfMixedPositiveAndZeroMembers(t *testing.T) {
	t.Parallel()
	b := setup(t, emulator.Faults{})
	onlyIn := b.Record(t, "cus_a", 100, 0)
	onlyOut := b.Record(t, "cus_a", 0, 50)
	both := b.Record(t, "cus_a", 10, 5)
	b.Start(t, workers.Config{})
	for _, id := range []uuid.UUID{onlyIn, onlyOut, both} {
		b.waitStatus(t, id, overage.BillingStatusBilled, 20*time.Second)
	}
	in, out := b.reportOf(t, both, overage.DimensionInput), b.reportOf(t, both, overage.DimensionOutput)
	if in.lead != onlyIn || !slices.Equal(in.members, []uuid.UUID{onlyIn, both}) || in.value != 110 {
		t.Fatalf("input report %+v", in)
	}
	if out.lead != onlyOut || !slices.Equal(out.members, []uuid.UUID{onlyOut, both}) || out.value != 55 {
		t.Fatalf("output report %+v", out)
	}
	var inLead, outLead *uuid.UUID
	if err := b.Pool.QueryRow(context.Background(), "SELECT input_report_lead, output_report_lead FROM usage_logs WHERE id = $1", onlyIn).
		Scan(&inLead, &outLead); err != nil || inLead == nil || *inLead != onlyIn || outLead != nil {
		t.Fatalf("a log with no output overage joined an output report: %v %v (%v)", inLead, outLead, err)
	}
	requireAppliedEqualsBilled(t, b)
}

// Many tenants, logs recorded while the workers run, and a Stripe that
// loses a third of its answers and fails a fifth of the calls: every log
// is billed, each report applied once, and Stripe's totals per customer and
// meter equal PostgreSQL's.
func TestLostAnswersAndServerErrorsNeverDoubleBill(t *testing.T) {
	t.Parallel()
	customers := []string{"cus_f1", "cus_f2", "cus_f3"}
	var ts []tenants.CreateParams
	for _, c := range customers {
		ts = append(ts, tenants.CreateParams{StripeCustomerID: c})
	}
	w := worktest.New(t, worktest.Options{Emulator: emulator.Options{Faults: emulator.Faults{LostResponseRate: 0.33, ServerErrorRate: 0.2}}, Tenants: ts})
	b := &bundle{World: w}
	b.Start(t, workers.Config{})
	var mu sync.Mutex
	var ids []uuid.UUID
	var wg sync.WaitGroup
	for _, c := range customers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				id, err := worktest.TryRecord(context.Background(), b.Ingest, b.Tenants[c].ID, time.Now().Add(-time.Minute), int64(i+1), int64(i%3))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
				time.Sleep(10 * time.Millisecond) // spread over several batch periods
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		b.waitStatus(t, id, overage.BillingStatusBilled, 60*time.Second)
	}
	var reports int
	if err := b.Pool.QueryRow(context.Background(), "SELECT count(*) FROM usage_reports").Scan(&reports); err != nil {
		t.Fatal(err)
	}
	if reports >= 2*len(ids) {
		t.Fatalf("%d reports for %d logs: nothing was gathered", reports, len(ids))
	}
	outcomes := map[string]int{}
	for _, r := range b.Emu.Requests() {
		outcomes[r.Outcome]++
	}
	if outcomes[emulator.OutcomeLostResponse] == 0 || outcomes[emulator.OutcomeFaultServerError] == 0 {
		t.Fatalf("outcomes %v: the faults did not happen", outcomes)
	}
	t.Log(fmt.Sprint(len(ids), " logs in ", reports, " reports; Stripe calls: ", outcomes))
	requireAppliedEqualsBilled(t, b)
}

// An ingest transaction that joined its tenant's report job but committed
// after the job had formed its reports (a straggler) has no job of its
// own: the job that reported something queues a follow-up for the next
// batch period, which bills the straggler without waiting for the sweep.
func TestALogCommittedAfterItsJobRanIsBilledByTheFollowUp(t *testing.T) {
	t.Parallel()
	b := setup(t, emulator.Faults{})
	ctx := context.Background()
	first := b.Record(t, "cus_a", 10, 1)
	// The follow-up is due a batch period after the round: 3 s, so that a
	// loaded machine still sees it waiting before it runs.
	stop := b.Start(t, workers.Config{SweepGrace: time.Hour, BatchDelay: 3 * time.Second})
	b.waitStatus(t, first, overage.BillingStatusBilled, 20*time.Second)

	rc, err := river.NewClient(riverpgxv5.New(b.Pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var followUp *rivertype.JobRow
	polltest.Until(t, "a follow-up report job", 10*time.Second, func() bool {
		res, err := rc.JobList(ctx, river.NewJobListParams().Kinds(outbox.ReportArgs{}.Kind()).
			States(rivertype.JobStateAvailable, rivertype.JobStateScheduled))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Jobs) == 1 {
			followUp = res.Jobs[0]
		}
		return followUp != nil
	})
	stop()

	straggler := uuid.Must(uuid.NewV7())
	if _, err := b.Pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status)
		SELECT $1, tenant_id, ts, user_id, model_id, 7, 0, period_start, 7, 0, 'pending' FROM usage_logs WHERE id = $2`, straggler, first); err != nil {
		t.Fatal(err)
	}
	b.Start(t, workers.Config{SweepGrace: time.Hour})
	b.waitStatus(t, straggler, overage.BillingStatusBilled, 20*time.Second)
	requireAppliedEqualsBilled(t, b)
}
