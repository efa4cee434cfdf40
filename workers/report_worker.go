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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/stripeclient"
)

// ReportWorker sends a usage log's overage to Stripe, one meter event per
// dimension, and marks the log billed when Stripe has accepted them all.
//
// Exactly once rests on three things. Every send carries the key
// overage.MeterEventKey(log, dimension) — the same on every attempt,
// requeue and restart — so Stripe applies a resend at most once within its
// window. The log's first attempt time is committed before the first send,
// so past the window the log is never resent automatically (it goes to
// needs_review). And "billed" is committed together with the job's
// completion, so a crash in between leaves a pending log whose resend
// Stripe deduplicates.
type ReportWorker struct {
	river.WorkerDefaults[outbox.ReportArgs]
	pool   *pgxpool.Pool
	stripe stripeclient.Sender
	meters map[overage.Dimension]string
	window windowGuard
	logger *slog.Logger
	// jobTimeout bounds one run; sends are abandoned before it.
	jobTimeout time.Duration
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

// windowGuard is when a log must no longer be sent automatically: its
// first send is older than Stripe's idempotency window minus a margin.
type windowGuard struct {
	window time.Duration
	margin time.Duration
}

// cutoff is how long after the first attempt sends must stop.
func (g windowGuard) cutoff() time.Duration { return g.window - g.margin }

// marginFor leaves room for clock skew between us and Stripe and for a
// send in flight: a tenth of the window, at most an hour.
func marginFor(window time.Duration) time.Duration { return min(window/10, time.Hour) }

type reportLog struct {
	customerID   string
	timestamp    time.Time
	overage      overage.Overage
	accepted     map[overage.Dimension]bool
	firstAttempt time.Time
	// remaining is how long sends may still go out, by the database clock.
	remaining time.Duration
	// suspended is the tenant's suspension reason (customer.deleted), if any.
	suspended *string
}

// Work implements river.Worker.
func (w *ReportWorker) Work(ctx context.Context, job *river.Job[outbox.ReportArgs]) error {
	id := job.Args.UsageLogID
	l, err := w.begin(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		// Billed, failed, under review or not billable already: nothing to
		// send. Completing the job is all that is left.
		return nil
	}
	if err != nil {
		return err
	}
	if l.suspended != nil {
		return w.suspended(ctx, id, *l.suspended)
	}
	if l.remaining <= 0 {
		return w.needsReview(ctx, job, l.firstAttempt)
	}

	// No send may start after the cutoff, by the database clock; a send in
	// flight is abandoned at it. The dimensions go to different meters, so
	// they are sent at once.
	sendCtx, cancel := context.WithTimeout(ctx, l.remaining)
	defer cancel()
	type outcome struct {
		d   overage.Dimension
		res stripeclient.Result
		err error
	}
	var outcomes []outcome
	for _, d := range overage.Dimensions {
		if l.overage.Of(d) > 0 && !l.accepted[d] {
			outcomes = append(outcomes, outcome{d: d})
		}
	}
	var wg sync.WaitGroup
	for i := range outcomes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := &outcomes[i]
			o.res, o.err = w.stripe.SendMeterEvent(sendCtx, stripeclient.MeterEvent{
				EventName:  w.meters[o.d],
				CustomerID: l.customerID,
				Value:      l.overage.Of(o.d),
				Timestamp:  l.timestamp,
				Key:        overage.MeterEventKey(id, o.d),
			})
		}()
	}
	wg.Wait()

	var accepted []overage.Dimension
	var failed *outcome
	for i, o := range outcomes {
		if o.err != nil {
			// A permanent failure decides the log's fate over a retryable
			// one, and any real failure over a busy refusal, which would
			// snooze without spending an attempt.
			if failed == nil || stripeclient.IsPermanent(o.err) || stripeclient.IsBusy(failed.err) {
				failed = &outcomes[i]
			}
			continue
		}
		w.logger.DebugContext(ctx, "meter event accepted", "usage_log_id", id, "dimension", o.d,
			"replayed", o.res.Replayed, "already_applied", o.res.AlreadyApplied, "stripe_request_id", o.res.RequestID)
		accepted = append(accepted, o.d)
	}
	if failed != nil {
		if err := w.recordAccepted(ctx, id, accepted); err != nil {
			return err
		}
		return w.sendFailed(ctx, id, failed.d, failed.err)
	}
	return w.markBilled(ctx, job, accepted)
}

// begin stamps the log's first attempt (kept when already set) and reads
// what to send, in one statement committed before anything is sent: if we
// crash mid-send, the window guard still knows when Stripe may first have
// seen the key. pgx.ErrNoRows means the log is not pending.
func (w *ReportWorker) begin(ctx context.Context, id uuid.UUID) (*reportLog, error) {
	l := &reportLog{accepted: map[overage.Dimension]bool{}}
	var inAt, outAt *time.Time
	var remaining float64
	err := w.pool.QueryRow(ctx, `UPDATE usage_logs u SET first_attempt_at = CASE WHEN t.suspended_at IS NULL THEN coalesce(u.first_attempt_at, now()) ELSE u.first_attempt_at END, updated_at = now()
		FROM tenants t WHERE u.id = $1 AND t.id = u.tenant_id AND u.billing_status = 'pending'
		RETURNING t.stripe_customer_id, u.ts, u.overage_input_tokens, u.overage_output_tokens,
			u.input_accepted_at, u.output_accepted_at, coalesce(u.first_attempt_at, now()),
			coalesce(extract(epoch FROM u.first_attempt_at + make_interval(secs => $2) - now())::float8, 0),
			CASE WHEN t.suspended_at IS NOT NULL THEN coalesce(t.suspended_reason, 'tenant suspended') END`, id, w.window.cutoff().Seconds()).
		Scan(&l.customerID, &l.timestamp, &l.overage.InputTokens, &l.overage.OutputTokens, &inAt, &outAt, &l.firstAttempt, &remaining, &l.suspended)
	if err != nil {
		return nil, fmt.Errorf("begin report of usage log %s: %w", id, err)
	}
	l.accepted[overage.DimensionInput] = inAt != nil
	l.accepted[overage.DimensionOutput] = outAt != nil
	l.remaining = seconds(remaining)
	return l, nil
}

// suspended fails the log of a suspended tenant (its Stripe customer was
// deleted) with the suspension reason and cancels the job: no retry can
// bill a customer Stripe no longer has. Nothing is sent. An operator may
// still resolve the log (overage review).
func (w *ReportWorker) suspended(ctx context.Context, id uuid.UUID, reason string) error {
	if _, err := w.pool.Exec(ctx, `UPDATE usage_logs SET billing_status = 'failed', billing_message = $2, updated_at = now()
		WHERE id = $1 AND billing_status = 'pending'`, id, reason); err != nil {
		return fmt.Errorf("mark usage log %s failed: %w", id, err)
	}
	w.logger.WarnContext(ctx, "usage log failed: tenant suspended", "usage_log_id", id, "reason", reason)
	return river.JobCancel(errors.New(reason))
}

// sendFailed decides what a failed send means for the log and the job.
func (w *ReportWorker) sendFailed(ctx context.Context, id uuid.UUID, d overage.Dimension, err error) error {
	var se *stripeclient.Error
	if errors.As(err, &se) && se.Kind == stripeclient.KindPermanent {
		msg := fmt.Sprintf("Stripe refused the %s meter event: %s", d, se.Message)
		if se.RequestID != "" {
			msg += " (request " + se.RequestID + ")"
		}
		if _, dbErr := w.pool.Exec(ctx, `UPDATE usage_logs SET billing_status = 'failed', billing_message = $2, updated_at = now()
			WHERE id = $1 AND billing_status = 'pending'`, id, msg); dbErr != nil {
			return fmt.Errorf("mark usage log %s failed: %w", id, dbErr)
		}
		w.logger.WarnContext(ctx, "usage log failed permanently", "usage_log_id", id, "dimension", d, "err", err)
		return river.JobCancel(err)
	}
	if errors.As(err, &se) && stripeclient.IsBusy(err) {
		// Nothing was sent: a call for this customer's meter has hung in
		// this process and others already wait behind it. Hand the slot
		// back to other customers' logs instead of joining the line; no
		// attempt is spent.
		return river.JobSnooze(se.RetryAfter/2 + rand.N(se.RetryAfter+1))
	}
	if errors.As(err, &se) && se.HTTPStatus == 429 {
		// Rate limited: try again soon without spending an attempt. The
		// window guard bounds how long this can go on.
		return river.JobSnooze(max(se.RetryAfter, backoff(0)))
	}
	return fmt.Errorf("send %s meter event of usage log %s: %w", d, id, err)
}

// recordAccepted commits the dimensions Stripe accepted in this run, when
// the run cannot finish: the next run then sends only what is missing.
func (w *ReportWorker) recordAccepted(ctx context.Context, id uuid.UUID, dims []overage.Dimension) error {
	for _, d := range dims {
		if _, err := w.pool.Exec(ctx, `UPDATE usage_logs SET `+string(d)+`_accepted_at = coalesce(`+string(d)+`_accepted_at, now()), updated_at = now() WHERE id = $1`, id); err != nil {
			return fmt.Errorf("record %s accepted for usage log %s: %w", d, id, err)
		}
	}
	return nil
}

// markBilled records the accepted dimensions, marks the log billed and
// completes the job in one transaction.
func (w *ReportWorker) markBilled(ctx context.Context, job *river.Job[outbox.ReportArgs], dims []overage.Dimension) error {
	accepted := map[overage.Dimension]bool{}
	for _, d := range dims {
		accepted[d] = true
	}
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		// A log the sweep moved to needs_review while this send was in
		// flight is billed after all: Stripe accepted every dimension.
		tag, err := tx.Exec(ctx, `UPDATE usage_logs SET
				input_accepted_at = CASE WHEN $2 THEN coalesce(input_accepted_at, now()) ELSE input_accepted_at END,
				output_accepted_at = CASE WHEN $3 THEN coalesce(output_accepted_at, now()) ELSE output_accepted_at END,
				billing_status = 'billed', billed_at = now(), billing_message = NULL, updated_at = now()
			WHERE id = $1 AND billing_status IN ('pending', 'needs_review')`,
			job.Args.UsageLogID, accepted[overage.DimensionInput], accepted[overage.DimensionOutput])
		if err != nil {
			return fmt.Errorf("mark usage log %s billed: %w", job.Args.UsageLogID, err)
		}
		if tag.RowsAffected() == 1 {
			w.logger.DebugContext(ctx, "usage log billed", "usage_log_id", job.Args.UsageLogID)
		}
		if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
			return fmt.Errorf("complete report job: %w", err)
		}
		return nil
	})
}

// needsReview parks a log whose first send is older than the window: a
// resend now might be applied a second time by Stripe.
func (w *ReportWorker) needsReview(ctx context.Context, job *river.Job[outbox.ReportArgs], firstAttempt time.Time) error {
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := park(ctx, tx, w.window, []uuid.UUID{job.Args.UsageLogID}); err != nil {
			return err
		}
		w.logger.WarnContext(ctx, "usage log needs review: past Stripe's idempotency window", "usage_log_id", job.Args.UsageLogID, "first_attempt_at", firstAttempt)
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

// park moves pending logs whose first send is past the window's cutoff to
// needs_review, saying why; the worker and the sweep share it. It returns
// how many it moved.
func park(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, g windowGuard, ids []uuid.UUID) (int64, error) {
	tag, err := db.Exec(ctx, `UPDATE usage_logs SET billing_status = 'needs_review', updated_at = now(),
			billing_message = format('first sent to Stripe at %s, longer ago than Stripe''s %s idempotency window allows for a safe resend; an operator must decide',
				to_char(first_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), $3::text)
		WHERE id = ANY($1) AND billing_status = 'pending'
			AND first_attempt_at < now() - make_interval(secs => $2)`, ids, g.cutoff().Seconds(), g.window.String())
	if err != nil {
		return 0, fmt.Errorf("mark usage logs needs_review: %w", err)
	}
	return tag.RowsAffected(), nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
