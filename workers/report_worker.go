package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/overage-billing/overage/meters"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/usagelog"
)

// ReportWorker reports a tenant's pending usage logs to Stripe: it sends
// the tenant's open reports again (formed earlier, not yet accepted), then
// forms new reports of the logs in none yet and sends them, one meter event
// per report, until nothing is left.
//
// Exactly once rests on three things, all in usagelog. A report's members,
// value, timestamp and key are committed before its first send and never
// change, so every resend — River retry, sweep requeue, restart after
// kill -9 — is the same event and Stripe applies it at most once within its
// window. The report's first attempt is committed with it, so past the
// window it is never resent automatically (needs_review). And its members
// become billed in the transaction that records its acceptance, so a crash
// in between leaves an open report whose resend Stripe deduplicates.
type ReportWorker struct {
	river.WorkerDefaults[outbox.ReportArgs]
	pool   *pgxpool.Pool
	store  *usagelog.Store
	stripe stripeclient.Sender
	// meters names each report's meter event: the default meters by
	// STRIPE_METER_*_EVENT, the others by the catalog.
	meters *meters.Store
	guard  usagelog.Guard
	logger *slog.Logger
	// jobTimeout bounds one run; sends are abandoned before it, and a run
	// hands its remaining work back (a snooze) after half of it.
	jobTimeout time.Duration
	batchMax   int
	closeGrace time.Duration
	// roundTries: see Config.RoundTries.
	roundTries int
	// inserter queues the follow-up job (see Work).
	inserter *outbox.Inserter
}

// claimLimit bounds the open reports one round sends again.
const claimLimit = 20

// defaultRoundTries is how many rounds in a row may fail transiently,
// settling nothing, before a run ends (Config.RoundTries): at a 40% error rate a report's three sends
// all fail 6% of the time, so a run is rarely spent on a flaky Stripe,
// while one that is down still ends the run within a second.
const defaultRoundTries = 3

// roundWait is the wait before the next round after fails rounds in a row
// failed: 100 ms doubling, jittered.
func roundWait(fails int) time.Duration {
	d := 100 * time.Millisecond << min(fails-1, 4)
	return d/2 + rand.N(d/2+1)
}

// sleepCtx waits d unless ctx ends first (false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Timeout implements river.Worker.
func (w *ReportWorker) Timeout(*river.Job[outbox.ReportArgs]) time.Duration { return w.jobTimeout }

// NextRetry implements river.Worker: exponential backoff with full jitter,
// 1 s doubling per error up to 10 minutes, so attempts spread out and a
// fleet of workers does not retry in lockstep.
func (w *ReportWorker) NextRetry(job *river.Job[outbox.ReportArgs]) time.Time {
	return time.Now().Add(backoff(len(job.Errors)))
}

func backoff(errorsSoFar int) time.Duration {
	d := time.Second << min(errorsSoFar, 10)
	d = min(d, 10*time.Minute)
	return d/2 + rand.N(d/2+1)
}

// Work implements river.Worker.
func (w *ReportWorker) Work(ctx context.Context, job *river.Job[outbox.ReportArgs]) error {
	tenantID := job.Args.TenantID
	if err := outbox.ForgetBatches(ctx, w.pool, tenantID, job.Args.Batch); err != nil {
		return err
	}
	tb, err := tenants.ReadBilling(ctx, w.pool, tenantID)
	if err != nil {
		return err
	}
	customer := tb.StripeCustomerID
	if tb.Suspended {
		// Stripe no longer has the customer: nothing is sent, and nothing
		// is failed either. The logs stay pending (open reports stay open,
		// their window still counted) until an operator gives the tenant
		// a customer Stripe knows, which lifts the suspension and queues
		// this job again. The job completes: retrying would only wait.
		w.logger.InfoContext(ctx, "report skipped: tenant suspended, its usage logs wait", "tenant_id", tenantID)
		return nil
	}
	handBack := time.Now().Add(w.jobTimeout / 2)
	// worked: this run sent something; progressed: it changed what is
	// billed — formed new reports (their members frozen) or settled a send
	// (accepted, failed for good, parked). A transient failure after
	// progress spends no attempt (see progressed below).
	worked, progressed := false, false
	// fails counts the rounds in a row that settled nothing and failed.
	fails := 0
	for {
		reports, err := w.store.Claim(ctx, usagelog.ClaimParams{TenantID: tenantID, Limit: claimLimit, Lease: w.jobTimeout, Guard: w.guard})
		if err != nil {
			return err
		}
		if len(reports) == 0 {
			reports, err = w.store.Form(ctx, usagelog.FormParams{TenantID: tenantID, MaxLogs: w.batchMax, Lease: w.jobTimeout, Guard: w.guard,
				CloseGrace: w.closeGrace})
			if err != nil {
				return w.failed(ctx, job, progressed, err)
			}
			progressed = progressed || len(reports) > 0
		}
		if len(reports) == 0 {
			// Another job holds an open report: a live one sends it, a
			// killed one's lease lapses; come back then.
			held, ok, err := w.store.HeldFor(ctx, tenantID)
			if err != nil {
				return err
			}
			if ok {
				return river.JobSnooze(held + time.Second)
			}
			if worked {
				return w.followUp(ctx, tenantID)
			}
			return nil
		}
		worked = true
		settled, err := w.round(ctx, customer, reports)
		progressed = progressed || settled
		var snooze *river.JobSnoozeError
		switch {
		case err == nil:
			fails = 0
		case errors.As(err, &snooze):
			return err
		default:
			// A transient failure: the failed reports were released, so
			// the next round claims them again, after a short wait. A run
			// ends on w.roundTries rounds in a row that settled nothing.
			if settled {
				fails = 0
			} else {
				fails++
			}
			if fails >= w.roundTries || time.Now().After(handBack) || !sleepCtx(ctx, roundWait(max(fails, 1))) {
				return w.failed(ctx, job, progressed, err)
			}
			continue
		}
		if time.Now().After(handBack) {
			// More may be left: give the slot back and come again at once,
			// without spending an attempt.
			return river.JobSnooze(0)
		}
	}
}

// failed is what a run that ends in err returns. A snooze (a 429, a
// hanging customer, the hand-back) spends no attempt anyway. A real failure
// spends one only when the run made no progress: after progress the job
// completes and the tenant's next job is queued to run after the first
// backoff step, its attempts whole. (A snooze would not do: it keeps the
// attempts the job spent before, so a busy tenant on a flaky Stripe would
// still run out of them over many rounds, and its remaining logs wait for
// the sweep.) So a job is discarded only after REPORT_MAX_ATTEMPTS runs in
// a row that moved nothing, and then the sweep requeues its logs.
func (w *ReportWorker) failed(ctx context.Context, job *river.Job[outbox.ReportArgs], progressed bool, err error) error {
	if !progressed || ctx.Err() != nil {
		return err
	}
	delay := backoff(0)
	if ferr := w.followUpAfter(ctx, job.Args.TenantID, delay); ferr != nil {
		return errors.Join(err, ferr)
	}
	w.logger.WarnContext(ctx, "report round failed after progress: the tenant's next job runs after a backoff, no attempt spent",
		"tenant_id", job.Args.TenantID, "attempt", job.Attempt, "retry_in", delay, "err", err)
	return nil
}

// followUp queues the tenant's job of the next batch period after a run
// that reported something. An ingest transaction of the period this job
// gathered may commit after the job formed its reports (it joined this job
// before it ran): without a follow-up its logs would wait for the tenant's
// next event or the sweep (SWEEP_GRACE). A follow-up that finds nothing
// queues none, so a quiet tenant costs one empty run.
func (w *ReportWorker) followUp(ctx context.Context, tenantID uuid.UUID) error {
	return w.followUpAfter(ctx, tenantID, 0)
}

// followUpAfter queues the tenant's job of the batch period delay from now.
func (w *ReportWorker) followUpAfter(ctx context.Context, tenantID uuid.UUID, delay time.Duration) error {
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return fmt.Errorf("queue follow-up report job of tenant %s: %w", tenantID, err)
	}
	if err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		_, err := w.inserter.InsertTenantReportsAfterTx(ctx, tx, client, []uuid.UUID{tenantID}, delay)
		return err
	}); err != nil {
		return fmt.Errorf("queue follow-up report job of tenant %s: %w", tenantID, err)
	}
	return nil
}

// outcome is what became of one report's send.
type outcome struct {
	report usagelog.Report
	res    stripeclient.Result
	err    error
	parked bool
}

// round sends reports at once (calls for one customer's meter queue in the
// Stripe client, one at a time), then records the outcomes. settled says
// that some send was recorded for good (accepted, failed, parked).
func (w *ReportWorker) round(ctx context.Context, customer string, reports []usagelog.Report) (settled bool, _ error) {
	outs := make([]outcome, len(reports))
	var wg sync.WaitGroup
	for i, r := range reports {
		outs[i].report = r
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = w.sendOne(ctx, customer, r)
		}()
	}
	wg.Wait()
	recErr := w.record(ctx, outs)

	var release []usagelog.Report
	for _, o := range outs {
		if recErr != nil || (o.err != nil && !stripeclient.IsPermanent(o.err)) {
			release = append(release, o.report)
		}
	}
	// Released even when the job is being stopped, so its retry (or any
	// job of the tenant) sends them without waiting for the lease to lapse.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := w.store.Release(rctx, release); err != nil {
		return false, err
	}
	if recErr != nil {
		return false, recErr
	}
	rs := make([]sendResult, len(outs))
	for i, o := range outs {
		rs[i] = classify(o)
		settled = settled || rs[i].kind == sendSettled
	}
	v := decide(rs)
	switch {
	case v.err != nil:
		return settled, v.err
	case v.jitter:
		return settled, river.JobSnooze(v.snooze/2 + rand.N(v.snooze+1))
	case v.snooze > 0:
		return settled, river.JobSnooze(v.snooze)
	}
	return settled, nil
}

// sendOne sends one report, unless it is past the window (then it parks
// it).
func (w *ReportWorker) sendOne(ctx context.Context, customer string, r usagelog.Report) outcome {
	o := outcome{report: r}
	if r.Remaining <= 0 {
		n, err := w.store.Park(ctx, r, w.guard)
		if err != nil {
			o.err = err
			return o
		}
		o.parked = true
		w.logger.WarnContext(ctx, "report needs review: past Stripe's idempotency window", "key", r.Key(), "usage_logs", n, "first_attempt_at", r.FirstAttemptAt)
		return o
	}
	// No send may start after the cutoff, by the database clock; a send in
	// flight is abandoned at it.
	cat, err := w.meters.Knowing(ctx, w.pool, []string{string(r.Dimension)})
	if err != nil {
		o.err = err
		return o
	}
	m, ok := cat.Meter(string(r.Dimension))
	if !ok || m.EventName == "" {
		o.err = fmt.Errorf("report %s: meter %q is not in the catalog", r.Key(), r.Dimension)
		return o
	}
	sendCtx, cancel := context.WithTimeout(ctx, r.Remaining)
	defer cancel()
	o.res, o.err = w.stripe.SendMeterEvent(sendCtx, stripeclient.MeterEvent{
		EventName: m.EventName, CustomerID: customer,
		Value: r.Value, Timestamp: r.Timestamp, Key: r.Key(),
	})
	return o
}

// record commits what the round's sends established: acceptances first
// (billing their members), then permanent failures, so a log one of whose
// dimensions Stripe accepted and the other refused shows both.
func (w *ReportWorker) record(ctx context.Context, outs []outcome) error {
	var accepted []usagelog.Report
	for _, o := range outs {
		if o.err == nil && !o.parked {
			accepted = append(accepted, o.report)
			w.logger.DebugContext(ctx, "report accepted", "key", o.report.Key(), "members", len(o.report.Members), "value", o.report.Value,
				"replayed", o.res.Replayed, "already_applied", o.res.AlreadyApplied, "stripe_request_id", o.res.RequestID)
		}
	}
	// One transaction for the round's acceptances: a log in an input and
	// an output report of the round is written once.
	if _, err := w.store.Accept(ctx, accepted...); err != nil {
		return err
	}
	for _, o := range outs {
		var se *stripeclient.Error
		if o.err == nil || !errors.As(o.err, &se) || se.Kind != stripeclient.KindPermanent {
			continue
		}
		r := o.report
		msg := fmt.Sprintf("Stripe refused the %s meter event %s: %s", r.Dimension, r.Key(), se.Message)
		if se.RequestID != "" {
			msg += " (request " + se.RequestID + ")"
		}
		if _, err := w.store.Fail(ctx, r, msg); err != nil {
			return err
		}
		w.logger.WarnContext(ctx, "report failed permanently", "key", r.Key(), "members", len(r.Members), "err", o.err)
	}
	return nil
}

// sendKind is what a send's outcome asks of the job.
type sendKind int

const (
	// sendSettled: accepted, parked or failed for good; recorded already.
	sendSettled sendKind = iota
	// sendFailed: a real failure (network, 5xx, 409, the database): retry
	// with backoff, spending an attempt.
	sendFailed
	// sendRateLimited: Stripe's 429.
	sendRateLimited
	// sendBusy: nothing was sent, a call for the customer's meter has hung
	// in this process and others already wait behind it.
	sendBusy
)

type sendResult struct {
	kind       sendKind
	retryAfter time.Duration
	err        error
}

func classify(o outcome) sendResult {
	var se *stripeclient.Error
	switch {
	case o.err == nil || stripeclient.IsPermanent(o.err):
		return sendResult{kind: sendSettled}
	case stripeclient.IsBusy(o.err) && errors.As(o.err, &se):
		return sendResult{kind: sendBusy, retryAfter: se.RetryAfter}
	case errors.As(o.err, &se) && se.HTTPStatus == 429:
		return sendResult{kind: sendRateLimited, retryAfter: se.RetryAfter}
	}
	return sendResult{kind: sendFailed, err: fmt.Errorf("send report %s: %w", o.report.Key(), o.err)}
}

// verdict is what a round means for the job: go on (zero), fail the
// attempt (err), or snooze without spending one (snooze; jitter asks for
// a random spread of about half of it on either side).
type verdict struct {
	err    error
	snooze time.Duration
	jitter bool
}

// decide combines the outcomes of one round. A real failure decides over a
// 429, and a 429 over a busy refusal, so a failing report spends its
// attempts while a rate limit or a hanging customer only snoozes. A 429
// waits at least the first backoff step.
func decide(rs []sendResult) verdict {
	var limited, busy time.Duration
	var isLimited, isBusy bool
	for _, r := range rs {
		switch r.kind {
		case sendFailed:
			return verdict{err: r.err}
		case sendRateLimited:
			isLimited, limited = true, max(limited, r.retryAfter)
		case sendBusy:
			isBusy, busy = true, max(busy, r.retryAfter)
		}
	}
	switch {
	case isLimited:
		return verdict{snooze: max(limited, minRateLimitWait)}
	case isBusy:
		return verdict{snooze: max(busy, time.Millisecond), jitter: true}
	}
	return verdict{}
}

// minRateLimitWait is the shortest snooze after a 429.
const minRateLimitWait = time.Second
