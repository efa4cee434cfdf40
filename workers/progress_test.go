package workers_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river/rivertype"

	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/worktest"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/workers"
)

var liveStates = []rivertype.JobState{rivertype.JobStateAvailable, rivertype.JobStatePending,
	rivertype.JobStateRetryable, rivertype.JobStateRunning, rivertype.JobStateScheduled}

// A busy tenant on a flaky Stripe: every round that bills something, or
// forms new reports, spends no attempt, so with two attempts a job and its
// follow-ups bill all 2,000 logs through 500s on 40% of the calls, without
// the (hourly) sweep and without a discarded job.
func TestAFlakyStripeSpendsNoAttemptOnARunThatMadeProgress(t *testing.T) {
	t.Parallel()
	const logs = 2000
	w := worktest.New(t, worktest.Options{Emulator: emulator.Options{Faults: emulator.Faults{ServerErrorRate: 0.4}},
		IngestMaxAttempts: 2, Tenants: []tenants.CreateParams{{StripeCustomerID: "cus_busy"}}})
	b := &bundle{World: w}
	tenant := b.Tenants["cus_busy"].ID
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range logs / 8 {
				if _, err := worktest.TryRecord(context.Background(), b.Ingest, tenant, time.Now().Add(-time.Minute), int64(g*1000+i+1), int64(i%5)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// Reports of 250 logs: several rounds, each of two reports (input and
	// output), so a run meets many 500s.
	b.Start(t, workers.Config{MaxAttempts: 2, BatchMax: 250, SweepGrace: time.Hour})
	polltest.Until(t, "every log billed", 120*time.Second, func() bool {
		var pending int
		if err := b.Pool.QueryRow(context.Background(), `SELECT count(*) FROM usage_logs WHERE billing_status <> 'billed'`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if n := countJobs(t, b.River, rivertype.JobStateDiscarded); n > 0 {
			t.Fatalf("%d report jobs discarded with %d logs unbilled", n, pending)
		}
		return pending == 0
	})
	var faults int
	for _, r := range b.Emu.Requests() {
		if r.Outcome == emulator.OutcomeFaultServerError {
			faults++
		}
	}
	if faults < 5 {
		t.Fatalf("%d 500s: the faults did not happen", faults)
	}
	t.Logf("%d logs billed through %d 500s in %d requests, %d report jobs", logs, faults, len(b.Emu.Requests()), len(reportJobs(t, b.River)))
	requireAppliedEqualsBilled(t, b)
}

// A Stripe that always fails: the job's first run formed the reports
// (progress, so its follow-up is queued), the follow-up makes none, backs
// off and is discarded after its two attempts; nothing is queued after it,
// and the logs wait, pending, for the sweep.
func TestAStripeThatAlwaysFailsStillEndsTheJobAfterItsAttempts(t *testing.T) {
	t.Parallel()
	w := worktest.New(t, worktest.Options{Emulator: emulator.Options{Faults: emulator.Faults{ServerErrorRate: 1}},
		IngestMaxAttempts: 2, Tenants: []tenants.CreateParams{{StripeCustomerID: "cus_down"}}})
	b := &bundle{World: w}
	var ids []any
	for i := range 20 {
		ids = append(ids, b.Record(t, "cus_down", int64(i+1), 1))
	}
	b.Start(t, workers.Config{MaxAttempts: 2, SweepGrace: time.Hour})
	polltest.Until(t, "no live report job and one discarded", 120*time.Second, func() bool {
		return len(reportJobs(t, b.River, liveStates...)) == 0 && countJobs(t, b.River, rivertype.JobStateDiscarded) >= 1
	})
	for _, j := range reportJobs(t, b.River, rivertype.JobStateDiscarded) {
		if j.Attempt != 2 || len(j.Errors) != 2 {
			t.Fatalf("discarded job %d after attempt %d with %d errors, want 2 and 2", j.ID, j.Attempt, len(j.Errors))
		}
		if gap := j.Errors[1].At.Sub(j.Errors[0].At); gap < 500*time.Millisecond {
			t.Fatalf("attempts %v apart: no backoff", gap)
		}
	}
	var pending int
	if err := b.Pool.QueryRow(context.Background(), `SELECT count(*) FROM usage_logs WHERE billing_status = 'pending'`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if pending != len(ids) {
		t.Fatalf("%d of %d logs pending", pending, len(ids))
	}
	for _, r := range b.Emu.Requests() {
		if r.Outcome != emulator.OutcomeFaultServerError {
			t.Fatalf("request %+v, want only 500s", r)
		}
	}
	t.Logf("%d requests, all 500", len(b.Emu.Requests()))
}
