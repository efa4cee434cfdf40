package workers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/testkit/billingtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/worktest"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/usagelog"
	"github.com/overage-billing/overage/workers"
	"github.com/riverqueue/river/rivertype"
)

type bundle struct {
	*worktest.World
}

// setup builds the world with three tenants: cus_a and cus_b without an
// allowance, cus_capped with 500 input tokens included.
func setup(t *testing.T, faults emulator.Faults) *bundle {
	t.Helper()
	return setupAttempts(t, faults, 0)
}

// setupAttempts is setup with ingest's report jobs given maxAttempts
// (REPORT_MAX_ATTEMPTS; 0 for the default).
func setupAttempts(t *testing.T, faults emulator.Faults, maxAttempts int) *bundle {
	t.Helper()
	w := worktest.New(t, worktest.Options{Emulator: emulator.Options{Faults: faults}, IngestMaxAttempts: maxAttempts, Tenants: []tenants.CreateParams{
		{Name: "cus_a", StripeCustomerID: "cus_a"},
		{Name: "cus_b", StripeCustomerID: "cus_b"},
		{Name: "cus_capped", StripeCustomerID: "cus_capped", IncludedInputTokens: 500},
	}})
	return &bundle{World: w}
}

func (b *bundle) status(t *testing.T, id uuid.UUID) (overage.BillingStatus, string) {
	t.Helper()
	var s overage.BillingStatus
	var msg *string
	if err := b.Pool.QueryRow(context.Background(), "SELECT billing_status, billing_message FROM usage_logs WHERE id = $1", id).Scan(&s, &msg); err != nil {
		t.Fatal(err)
	}
	if msg == nil {
		return s, ""
	}
	return s, *msg
}

func (b *bundle) waitStatus(t *testing.T, id uuid.UUID, want overage.BillingStatus, timeout time.Duration) {
	t.Helper()
	polltest.Until(t, fmt.Sprintf("usage log %s to be %s", id, want), timeout, func() bool {
		s, _ := b.status(t, id)
		return s == want
	})
}

// requestsFor returns what the emulator received for a log's dimension, and
// fails unless every one carried the derived key as both the
// Idempotency-Key and the identifier.
func (b *bundle) requestsFor(t *testing.T, id uuid.UUID, d overage.Dimension) []emulator.Request {
	t.Helper()
	want := overage.MeterEventKey(id, d)
	out := b.KeyedRequests(t, id, d)
	for _, r := range b.Emu.Requests() {
		if strings.Contains(r.IdempotencyKey, id.String()) && r.IdempotencyKey != want && !strings.HasSuffix(r.IdempotencyKey, ":input") && !strings.HasSuffix(r.IdempotencyKey, ":output") {
			t.Fatalf("a request for %s carried a key not derived from it: %q", id, r.IdempotencyKey)
		}
	}
	return out
}

// report is a report as PostgreSQL holds it.
type report struct {
	lead    uuid.UUID
	members []uuid.UUID
	value   int64
	ts      time.Time
	state   string
}

func (r report) key(d overage.Dimension) string { return overage.MeterEventKey(r.lead, d) }

// reportOf returns the report carrying dimension d of usage log id.
func (b *bundle) reportOf(t *testing.T, id uuid.UUID, d overage.Dimension) report {
	t.Helper()
	var r report
	if err := b.Pool.QueryRow(context.Background(), `SELECT r.lead_usage_log_id, r.member_ids, r.value, r.ts, r.state
		FROM usage_logs u JOIN usage_reports r ON r.dimension = $2
			AND r.lead_usage_log_id = CASE $2 WHEN 'input' THEN u.input_report_lead ELSE `+usagelog.OutputReportLeadSQL("u")+` END
		WHERE u.id = $1`, id, string(d)).Scan(&r.lead, &r.members, &r.value, &r.ts, &r.state); err != nil {
		t.Fatalf("report of %s %s: %v", id, d, err)
	}
	return r
}

func TestReportBillsEveryLogOnceInOneMeterEventPerDimension(t *testing.T) {
	t.Parallel()
	b := setup(t, emulator.Faults{})
	var ids []uuid.UUID
	for i := range 10 {
		ids = append(ids, b.Record(t, "cus_a", int64(100+i), 10))
		ids = append(ids, b.Record(t, "cus_capped", 300, 7)) // the second one crosses 500 included
	}
	b.Start(t, workers.Config{BatchDelay: time.Hour}) // the sweep's jobs must not split the batch
	for _, id := range ids {
		b.waitStatus(t, id, overage.BillingStatusBilled, 20*time.Second)
	}
	requireAppliedEqualsBilled(t, b)
	// Without faults and within one batch period, each tenant's dimension
	// is one meter event, led by its oldest log, carrying every log.
	reqs := b.Emu.Requests()
	for _, r := range reqs {
		if r.Outcome != emulator.OutcomeApplied {
			t.Fatalf("unexpected outcome without faults: %+v", r)
		}
	}
	if len(reqs) != 4 {
		t.Fatalf("%d meter event calls for 2 tenants x 2 dimensions, want 4", len(reqs))
	}
	a := b.reportOf(t, ids[0], overage.DimensionInput)
	if a.lead != ids[0] || len(a.members) != 10 || a.value != 100*10+45 {
		t.Fatalf("input report of cus_a: %+v, want 10 members led by %s worth 1045", a, ids[0])
	}
	// cus_capped: the first log is under the allowance in input (no input
	// overage), so the input report is led by the second.
	c := b.reportOf(t, ids[3], overage.DimensionInput)
	if c.lead != ids[3] || len(c.members) != 9 || c.value != 100+8*300 {
		t.Fatalf("input report of cus_capped: %+v, want 9 members led by %s worth 2500", c, ids[3])
	}
	if o := b.reportOf(t, ids[1], overage.DimensionOutput); o.lead != ids[1] || len(o.members) != 10 || o.value != 70 {
		t.Fatalf("output report of cus_capped: %+v", o)
	}
	var billedAt *time.Time
	if err := b.Pool.QueryRow(context.Background(), "SELECT billed_at FROM usage_logs WHERE id = $1", ids[0]).Scan(&billedAt); err != nil || billedAt == nil {
		t.Fatalf("billed_at = %v (%v)", billedAt, err)
	}
}

func requireAppliedEqualsBilled(t *testing.T, b *bundle) {
	t.Helper()
	billingtest.RequireStripeMatchesBilled(t, b.Pool, b.Emu)
}

// reportJobs lists, through River, the report jobs in the states given (in
// every state when none is), oldest first.
func reportJobs(t *testing.T, rc *river.Client[pgx.Tx], states ...rivertype.JobState) []*rivertype.JobRow {
	t.Helper()
	p := river.NewJobListParams().Kinds(outbox.ReportArgs{}.Kind()).OrderBy(river.JobListOrderByID, river.SortOrderAsc).First(10000)
	if len(states) > 0 {
		p = p.States(states...)
	}
	res, err := rc.JobList(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return res.Jobs
}

func countJobs(t *testing.T, rc *river.Client[pgx.Tx], state rivertype.JobState) int {
	t.Helper()
	return len(reportJobs(t, rc, state))
}

func TestRiverRetryAndRestartKeepTheKeyAndBillOnce(t *testing.T) {
	t.Parallel()
	// The first answer is lost (Stripe applied the event), the River retry
	// meets a 500, then the process restarts and the next one succeeds.
	b := setup(t, emulator.Faults{LostResponseRate: 1})
	id := b.Record(t, "cus_a", 100, 0)
	stop := b.Start(t, workers.Config{})
	polltest.Until(t, "the lost response", 20*time.Second, func() bool { return len(b.requestsFor(t, id, overage.DimensionInput)) >= 1 })
	b.Emu.SetFaults(emulator.Faults{ServerErrorRate: 1})
	polltest.Until(t, "a River retry", 20*time.Second, func() bool { return len(b.requestsFor(t, id, overage.DimensionInput)) >= 2 })
	stop() // restart: a new process picks the job up
	b.Emu.SetFaults(emulator.Faults{})
	b.Start(t, workers.Config{})
	b.waitStatus(t, id, overage.BillingStatusBilled, 30*time.Second)

	reqs := b.requestsFor(t, id, overage.DimensionInput)
	for _, r := range reqs {
		t.Logf("%+v", r)
	}
	if len(reqs) < 3 {
		t.Fatalf("%d requests, want the lost one, a retry and one after the restart", len(reqs))
	}
	if reqs[len(reqs)-1].Outcome != emulator.OutcomeReplayed {
		t.Fatalf("last answer %q, want Stripe's replay of the saved response", reqs[len(reqs)-1].Outcome)
	}
	if n := b.Emu.AppliedCount(overage.MeterEventKey(id, overage.DimensionInput)); n != 1 {
		t.Fatalf("applied %d times, want once", n)
	}
	requireAppliedEqualsBilled(t, b)
}

// loseThenFail waits for lost answers (a run that formed its reports and
// lost their answers made progress: with RoundTries 1 it ends there, and
// its follow-up runs after the first backoff step), then fails every call, so the follow-up makes no progress and,
// with one attempt, is discarded while the logs stay pending.
func (b *bundle) loseThenFail(t *testing.T, lost int) {
	t.Helper()
	polltest.Until(t, fmt.Sprint(lost, " lost answers"), 20*time.Second, func() bool {
		n := 0
		for _, r := range b.Emu.Requests() {
			if r.Outcome == emulator.OutcomeLostResponse {
				n++
			}
		}
		return n >= lost
	})
	b.Emu.SetFaults(emulator.Faults{ServerErrorRate: 1})
}

func TestSweepResolvesALostResponseWithoutASecondCharge(t *testing.T) {
	t.Parallel()
	// One attempt only: the lost responses, then the follow-up's 500s,
	// discard the job while the log stays pending although Stripe applied
	// it.
	b := setupAttempts(t, emulator.Faults{LostResponseRate: 1}, 1)
	id := b.Record(t, "cus_b", 40, 2)
	stop := b.Start(t, workers.Config{MaxAttempts: 1, RoundTries: 1})
	b.loseThenFail(t, 2)
	polltest.Until(t, "the job to be discarded", 20*time.Second, func() bool { return countJobs(t, b.River, rivertype.JobStateDiscarded) == 1 })
	if s, _ := b.status(t, id); s != overage.BillingStatusPending {
		t.Fatalf("status %s, want pending", s)
	}
	stop()
	b.Emu.SetFaults(emulator.Faults{})
	// A sweep with no grace requeues it at once.
	b.Start(t, workers.Config{SweepInterval: 200 * time.Millisecond, SweepGrace: time.Millisecond})
	defer func() {
		rows, _ := b.Pool.Query(context.Background(), "SELECT kind, state::text, attempt, errors::text FROM river_job ORDER BY id")
		for rows.Next() {
			var k, st string
			var a int
			var e *string
			_ = rows.Scan(&k, &st, &a, &e)
			t.Logf("job %s %s %d %v", k, st, a, e)
		}
	}()
	b.waitStatus(t, id, overage.BillingStatusBilled, 20*time.Second)
	for _, d := range overage.Dimensions {
		if n := b.Emu.AppliedCount(overage.MeterEventKey(id, d)); n != 1 {
			t.Fatalf("%s applied %d times, want once", d, n)
		}
		if len(b.requestsFor(t, id, d)) < 1 {
			t.Fatalf("no request for %s", d)
		}
	}
	requireAppliedEqualsBilled(t, b)
}

func TestSweepSkipsTenantsWithALiveJob(t *testing.T) {
	t.Parallel()
	// A day-long batch period: ingest's jobs and the sweep's fall in the same
	// period (unless the test straddles midnight UTC).
	b := worktest.New(t, worktest.Options{BatchDelay: 24 * time.Hour, Tenants: []tenants.CreateParams{
		{StripeCustomerID: "cus_a"}, {StripeCustomerID: "cus_b"}}})
	b.Record(t, "cus_a", 5, 5)
	b.Record(t, "cus_a", 6, 6)
	b.Record(t, "cus_b", 6, 6)
	// No workers run: both tenants' jobs are live (scheduled). A sweep
	// inserts none.
	sweeper := workers.NewSweeper(b.Pool, workers.Config{SweepGrace: time.Millisecond, BatchDelay: 24 * time.Hour})
	rc, err := river.NewClient(riverpgxv5.New(b.Pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if n := countJobs(t, b.River, rivertype.JobStateAvailable); n != 2 {
		t.Fatalf("%d report jobs, want one per tenant", n)
	}
	// Swept until both tenants' logs are past the 1 ms grace: each sweep
	// finds their jobs live and requeues none.
	polltest.Until(t, "a sweep that sees both tenants", 5*time.Second, func() bool {
		res, err := sweeper.Sweep(context.Background(), rc)
		if err != nil {
			t.Fatal(err)
		}
		if res.Requeued != 0 || res.Skipped > 2 {
			t.Fatalf("sweep with live jobs: %+v, want 2 skipped", res)
		}
		return res.Skipped == 2
	})
	jobs, err := rc.JobList(context.Background(), river.NewJobListParams().Kinds(outbox.ReportArgs{}.Kind()))
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs.Jobs {
		if _, err := rc.JobCancel(context.Background(), j.ID); err != nil {
			t.Fatal(err)
		}
	}
	res, err := sweeper.Sweep(context.Background(), rc)
	if err != nil || res.Requeued != 2 {
		t.Fatalf("sweep after discard: %+v %v, want 2 requeued", res, err)
	}
}

func TestWindowGuardParksAReportsLogsAndStopsSending(t *testing.T) {
	t.Parallel()
	b := setup(t, emulator.Faults{BlackholeCustomers: []string{"cus_b"}})
	ids := []uuid.UUID{b.Record(t, "cus_b", 10, 0), b.Record(t, "cus_b", 20, 0), b.Record(t, "cus_b", 30, 0)}
	const window = 3 * time.Second
	b.Start(t, workers.Config{IdempotencyWindow: window, SweepInterval: 500 * time.Millisecond, SweepGrace: time.Millisecond, JobTimeout: 2 * time.Second})
	for _, id := range ids {
		b.waitStatus(t, id, overage.BillingStatusNeedsReview, 30*time.Second)
	}
	r := b.reportOf(t, ids[0], overage.DimensionInput)
	if r.state != "needs_review" || len(r.members) != 3 {
		t.Fatalf("report %+v, want the three logs parked together", r)
	}
	var first time.Time
	if err := b.Pool.QueryRow(context.Background(), "SELECT first_attempt_at FROM usage_reports WHERE lead_usage_log_id = $1", r.lead).Scan(&first); err != nil {
		t.Fatal(err)
	}
	// Nothing can go out later: River lists no report job that could still
	// run (the sweep queues none for parked logs). So the requests the
	// emulator saw are all there will be.
	// A job that parked the logs may still be finishing.
	polltest.Until(t, "no report job left that could send", 10*time.Second, func() bool {
		return len(reportJobs(t, b.River, rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable,
			rivertype.JobStateRunning, rivertype.JobStateScheduled)) == 0
	})
	reqs := requestsOf(t, b, r, overage.DimensionInput)
	if len(reqs) == 0 {
		t.Fatal("nothing was sent at all")
	}
	for _, q := range reqs {
		if q.ReceivedAt.After(first.Add(window)) {
			t.Fatalf("a request with the key was sent at %s, after the window closed at %s", q.ReceivedAt, first.Add(window))
		}
	}
	for _, id := range ids {
		if s, msg := b.status(t, id); s != overage.BillingStatusNeedsReview || !strings.Contains(msg, "idempotency window") {
			t.Fatalf("status %s %q", s, msg)
		}
	}
	if len(b.Emu.Events()) != 0 {
		t.Fatal("a blackholed customer's event was applied")
	}
}

func TestPermanentErrorFailsTheLogAndStopsRetrying(t *testing.T) {
	t.Parallel()
	b := setup(t, emulator.Faults{})
	b.Emu.SetCustomerFailure("cus_b", "No such customer: 'cus_b'")
	id := b.Record(t, "cus_b", 10, 0)
	ok := b.Record(t, "cus_a", 10, 0)
	b.Start(t, workers.Config{})
	b.waitStatus(t, id, overage.BillingStatusFailed, 20*time.Second)
	b.waitStatus(t, ok, overage.BillingStatusBilled, 20*time.Second)
	if _, msg := b.status(t, id); !strings.Contains(msg, "No such customer") {
		t.Fatalf("failure message %q does not carry Stripe's", msg)
	}
	if r := b.reportOf(t, id, overage.DimensionInput); r.state != "failed" {
		t.Fatalf("report of the failed log is %s, want failed", r.state)
	}
	// The report is settled: its job completes instead of retrying.
	polltest.Until(t, "the report jobs to complete", 10*time.Second, func() bool {
		return countJobs(t, b.River, rivertype.JobStateCompleted) >= 2 && countJobs(t, b.River, rivertype.JobStateRetryable)+countJobs(t, b.River, rivertype.JobStateAvailable) == 0
	})
	if n := len(b.requestsFor(t, id, overage.DimensionInput)); n != 1 {
		t.Fatalf("%d requests for a permanently failing log, want 1", n)
	}
}

var _ = pgx.ErrNoRows

// A customer whose calls hang must not stall everyone else's billing: the
// reports queued behind it beyond a short line are snoozed, not left
// holding every worker slot until their job timeout.
func TestOneHangingCustomerDoesNotHoldEveryWorker(t *testing.T) {
	t.Parallel()
	b := setup(t, emulator.Faults{BlackholeCustomers: []string{"cus_b"}})
	var stuck, others []uuid.UUID
	for range 8 { // enqueued first, so River fetches them first
		stuck = append(stuck, b.Record(t, "cus_b", 100, 0))
	}
	for range 3 {
		others = append(others, b.Record(t, "cus_a", 100, 10))
	}
	b.Start(t, workers.Config{ReportWorkers: 4, JobTimeout: 5 * time.Minute, StopTimeout: time.Second})
	for _, id := range others {
		b.waitStatus(t, id, overage.BillingStatusBilled, 20*time.Second)
	}
	for _, id := range stuck {
		if s, _ := b.status(t, id); s != overage.BillingStatusPending {
			t.Fatalf("log %s of the hanging customer is %s, want pending", id, s)
		}
	}
	sentToB := func() int {
		var sent int
		for _, r := range b.Emu.Requests() {
			if r.Customer == "cus_b" {
				sent++
			}
		}
		return sent
	}
	polltest.Until(t, "the hanging customer's report to be in flight", 10*time.Second, func() bool { return sentToB() > 0 })
	if sent := sentToB(); sent != 1 {
		t.Fatalf("%d calls reached Stripe for the hanging customer, want the one in flight", sent)
	}
}
