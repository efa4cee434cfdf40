package review

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/outbox"
)

// Action is an operator's decision on a usage log under review.
type Action string

const (
	// ActionBilled: the operator has confirmed that Stripe holds the usage;
	// the log becomes billed without anything being sent.
	ActionBilled Action = "billed"
	// ActionResend: send the log again, under the same keys. The only path
	// by which a needs_review or failed log is ever sent again.
	ActionResend Action = "resend"
	// ActionVoid: never bill the log; it becomes not_billable.
	ActionVoid Action = "void"
)

// Actions lists every action, in the order the CLI shows them.
var Actions = []Action{ActionBilled, ActionResend, ActionVoid}

// Valid reports whether a is one of Actions.
func (a Action) Valid() bool {
	return a == ActionBilled || a == ActionResend || a == ActionVoid
}

// DefaultIdempotencyWindow is Stripe's, used when ResolveParams leave it zero.
const DefaultIdempotencyWindow = 24 * time.Hour

// ResolveParams are the inputs of Resolve.
type ResolveParams struct {
	UsageLogID uuid.UUID
	Action     Action
	// Reason says why; Actor says who. Both are required and recorded.
	Reason, Actor string
	// Force allows a resend while Stripe may still hold the log's keys
	// (inside IdempotencyWindow of its first attempt). Only for resend.
	Force bool
	// IdempotencyWindow is how long Stripe (or the emulator) remembers an
	// idempotency key: STRIPE_IDEMPOTENCY_WINDOW. Zero means 24h.
	IdempotencyWindow time.Duration
}

// Validate reports every problem with p at once, as an EINVALID error
// whose Fields are named after the CLI's flags ("as", "reason", "by",
// "force"; "id" for the positional usage log id).
func (p ResolveParams) Validate() error {
	var fields []overage.FieldError
	if p.UsageLogID == uuid.Nil {
		fields = append(fields, overage.FieldError{Field: "id", Detail: "a usage log id is required"})
	}
	if !p.Action.Valid() {
		d := "is required: billed, resend or void"
		if p.Action != "" {
			d = fmt.Sprintf("%q is not one of billed, resend or void", string(p.Action))
		}
		fields = append(fields, overage.FieldError{Field: "as", Detail: d})
	}
	if strings.TrimSpace(p.Reason) == "" {
		fields = append(fields, overage.FieldError{Field: "reason", Detail: "is required: say why, for the audit trail"})
	}
	if strings.TrimSpace(p.Actor) == "" {
		fields = append(fields, overage.FieldError{Field: "by", Detail: "is required: who decides, for the audit trail"})
	}
	if p.Force && p.Action.Valid() && p.Action != ActionResend {
		fields = append(fields, overage.FieldError{Field: "force", Detail: "applies only to --as resend"})
	}
	if p.IdempotencyWindow < 0 {
		fields = append(fields, overage.FieldError{Field: "idempotency-window", Detail: "must not be negative"})
	}
	if len(fields) > 0 {
		return overage.Invalid(fields, "invalid review resolution")
	}
	return nil
}

// Resolution is what Resolve did.
type Resolution struct {
	// AuditID is the review_actions row recording the decision.
	AuditID    uuid.UUID `json:"audit_id"`
	UsageLogID uuid.UUID `json:"usage_log_id"`
	Action     Action    `json:"action"`
	Actor      string    `json:"actor"`
	Reason     string    `json:"reason"`
	// Forced: a resend went out inside the idempotency window because of
	// Force (Force outside the window changes nothing and is not recorded).
	Forced bool `json:"forced"`
	// The log as the operator found it.
	PreviousStatus  overage.BillingStatus `json:"previous_status"`
	PreviousMessage *string               `json:"previous_message"`
	FirstAttemptAt  *time.Time            `json:"first_attempt_at"`
	// The log now.
	Status  overage.BillingStatus `json:"billing_status"`
	Message string                `json:"billing_message"`
	// ResolvedAt is the database's time of the decision.
	ResolvedAt time.Time `json:"resolved_at"`
	// Dimensions are, for a resend, the dimensions the report job will
	// send (overage and not yet accepted by Stripe); for billed and void,
	// the dimensions Stripe had already accepted.
	Dimensions []overage.Dimension `json:"dimensions"`
	// ReportJob is, for a resend, the River job that will send the log.
	ReportJob *QueuedJob `json:"report_job,omitempty"`
}

// QueuedJob is the report job of a resend.
type QueuedJob struct {
	ID          int64     `json:"id"`
	State       string    `json:"state"`
	ScheduledAt time.Time `json:"scheduled_at"`
	// Existing: a live job for the log was already queued (left by the
	// sweep) and will do the resend; no second one was added.
	Existing bool `json:"existing"`
}

// String is a one-line summary for an operator.
func (r *Resolution) String() string {
	s := fmt.Sprintf("usage log %s: %s -> %s (%s)", r.UsageLogID, r.PreviousStatus, r.Status, r.Message)
	if r.ReportJob != nil {
		dims := make([]string, len(r.Dimensions))
		for i, d := range r.Dimensions {
			dims[i] = string(d)
		}
		what := "nothing left to send"
		if len(dims) > 0 {
			what = "will send " + strings.Join(dims, " and ")
		}
		queued := "queued"
		if r.ReportJob.Existing {
			queued = "already queued"
		}
		s += fmt.Sprintf("; report job %d %s (%s), %s", r.ReportJob.ID, queued, r.ReportJob.State, what)
	}
	return s + "; audit " + r.AuditID.String()
}

// Resolver applies operators' decisions.
type Resolver struct {
	pool     *pgxpool.Pool
	inserter *outbox.Inserter
}

// NewResolver returns a Resolver writing to pool and queueing resends with
// inserter (REPORT_MAX_ATTEMPTS attempts per job, like ingest's).
func NewResolver(pool *pgxpool.Pool, inserter *outbox.Inserter) *Resolver {
	return &Resolver{pool: pool, inserter: inserter}
}

// reviewLog is a usage log as Resolve finds it, with the database clock's
// view of its idempotency window.
type reviewLog struct {
	status         overage.BillingStatus
	message        *string
	firstAttemptAt *time.Time
	overage        overage.Overage
	accepted       map[overage.Dimension]bool
	now            time.Time
	// windowEndsAt is when Stripe forgets the keys of the first attempt;
	// insideWindow says it has not yet, by the database clock.
	windowEndsAt *time.Time
	insideWindow bool
}

// Resolve records an operator's decision on a usage log in needs_review or
// failed and applies it, in one transaction: the log is locked, checked,
// audited, changed and — for a resend — its report job queued, or nothing
// happens at all. Errors an operator can act on are *overage.Error:
// EINVALID (bad params), ENOTFOUND (no such log), ECONFLICT with type
// "not-reviewable" (the log is not under review, e.g. already resolved),
// "resend-inside-window" (Stripe may still hold its keys; RetryAfter says
// for how long) or "report-job-running" (try again in a moment).
func (r *Resolver) Resolve(ctx context.Context, p ResolveParams) (*Resolution, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p.IdempotencyWindow == 0 {
		p.IdempotencyWindow = DefaultIdempotencyWindow
	}
	if p.Action == ActionResend && r.inserter == nil {
		return nil, errors.New("review: a resend needs an outbox inserter")
	}
	p.Reason, p.Actor = strings.TrimSpace(p.Reason), strings.TrimSpace(p.Actor)

	var res *Resolution
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		l, err := lockLog(ctx, tx, p.UsageLogID, p.IdempotencyWindow)
		if err != nil {
			return err
		}
		if l.status != overage.BillingStatusNeedsReview && l.status != overage.BillingStatusFailed {
			return overage.Errorf(overage.ECONFLICT, "not-reviewable",
				"usage log %s is %s, not needs_review or failed: only those are resolved by an operator", p.UsageLogID, l.status)
		}
		if p.Action == ActionResend {
			if l.insideWindow && !p.Force {
				e := overage.Errorf(overage.ECONFLICT, "resend-inside-window",
					"usage log %s was first sent at %s; Stripe may hold its keys (usage-log:%s:<dimension>) until %s by the database clock and would answer a resend from that attempt instead of sending it; resend after %s, resolve it as billed or void, or pass --force to resend now under the same keys",
					p.UsageLogID, fmtTime(*l.firstAttemptAt), p.UsageLogID, fmtTime(*l.windowEndsAt), fmtTime(*l.windowEndsAt))
				e.RetryAfter = l.windowEndsAt.Sub(l.now)
				return e
			}
			if err := refuseWhileJobRuns(ctx, tx, p.UsageLogID); err != nil {
				return err
			}
		}

		res = &Resolution{
			UsageLogID: p.UsageLogID, Action: p.Action, Actor: p.Actor, Reason: p.Reason,
			Forced:         p.Force && l.insideWindow,
			PreviousStatus: l.status, PreviousMessage: l.message, FirstAttemptAt: l.firstAttemptAt,
			Dimensions: []overage.Dimension{},
		}
		if res.AuditID, err = uuid.NewV7(); err != nil {
			return fmt.Errorf("audit id: %w", err)
		}
		if err := tx.QueryRow(ctx, `INSERT INTO review_actions
				(id, usage_log_id, action, reason, actor, previous_status, previous_message, first_attempt_at, forced)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING created_at`,
			res.AuditID, p.UsageLogID, string(p.Action), p.Reason, p.Actor, string(l.status), l.message, l.firstAttemptAt, res.Forced).
			Scan(&res.ResolvedAt); err != nil {
			return fmt.Errorf("record review of usage log %s: %w", p.UsageLogID, err)
		}
		res.ResolvedAt = res.ResolvedAt.UTC()

		switch p.Action {
		case ActionBilled:
			res.Status = overage.BillingStatusBilled
			res.Message = fmt.Sprintf("marked billed by %s: %s", p.Actor, p.Reason)
			res.Dimensions = l.acceptedDimensions()
			_, err = tx.Exec(ctx, `UPDATE usage_logs SET billing_status = 'billed', billed_at = now(), billing_message = $2, updated_at = now()
				WHERE id = $1`, p.UsageLogID, res.Message)
		case ActionVoid:
			res.Status = overage.BillingStatusNotBillable
			res.Message = fmt.Sprintf("voided by %s: %s", p.Actor, p.Reason)
			res.Dimensions = l.acceptedDimensions()
			if len(res.Dimensions) > 0 {
				res.Message += fmt.Sprintf(" (Stripe had already accepted %s)", joinDims(res.Dimensions))
			}
			_, err = tx.Exec(ctx, `UPDATE usage_logs SET billing_status = 'not_billable', billing_message = $2, updated_at = now()
				WHERE id = $1`, p.UsageLogID, res.Message)
		case ActionResend:
			res.Status = overage.BillingStatusPending
			res.Message = fmt.Sprintf("resend requested by %s: %s", p.Actor, p.Reason)
			if res.Forced {
				res.Message += " (forced inside Stripe's idempotency window)"
			}
			for _, d := range overage.Dimensions {
				if l.overage.Of(d) > 0 && !l.accepted[d] {
					res.Dimensions = append(res.Dimensions, d)
				}
			}
			// A new window starts with the next send: the worker stamps
			// first_attempt_at again. The *_accepted_at columns stay, so a
			// dimension Stripe already accepted is never sent again.
			_, err = tx.Exec(ctx, `UPDATE usage_logs SET billing_status = 'pending', first_attempt_at = NULL, billed_at = NULL,
					billing_message = $2, updated_at = now()
				WHERE id = $1`, p.UsageLogID, res.Message)
		}
		if err != nil {
			return fmt.Errorf("resolve usage log %s as %s: %w", p.UsageLogID, p.Action, err)
		}
		if p.Action == ActionResend {
			res.ReportJob, err = queueReport(ctx, tx, r.inserter, p.UsageLogID)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// lockLog reads the log FOR UPDATE: the worker, the sweep and another
// operator wait for this transaction, then see what it decided.
func lockLog(ctx context.Context, tx pgx.Tx, id uuid.UUID, window time.Duration) (*reviewLog, error) {
	l := &reviewLog{accepted: map[overage.Dimension]bool{}}
	var inAt, outAt *time.Time
	err := tx.QueryRow(ctx, `SELECT billing_status, billing_message, first_attempt_at,
			overage_input_tokens, overage_output_tokens, input_accepted_at, output_accepted_at,
			now(), first_attempt_at + make_interval(secs => $2),
			coalesce(first_attempt_at + make_interval(secs => $2) > now(), false)
		FROM usage_logs WHERE id = $1 FOR UPDATE`, id, window.Seconds()).
		Scan(&l.status, &l.message, &l.firstAttemptAt, &l.overage.InputTokens, &l.overage.OutputTokens, &inAt, &outAt,
			&l.now, &l.windowEndsAt, &l.insideWindow)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, overage.Errorf(overage.ENOTFOUND, "usage-log-not-found", "no usage log %s", id)
	}
	if err != nil {
		return nil, fmt.Errorf("read usage log %s: %w", id, err)
	}
	l.accepted[overage.DimensionInput] = inAt != nil
	l.accepted[overage.DimensionOutput] = outAt != nil
	l.firstAttemptAt, l.windowEndsAt = utc(l.firstAttemptAt), utc(l.windowEndsAt)
	return l, nil
}

func (l *reviewLog) acceptedDimensions() []overage.Dimension {
	out := []overage.Dimension{}
	for _, d := range overage.Dimensions {
		if l.accepted[d] {
			out = append(out, d)
		}
	}
	return out
}

func joinDims(dims []overage.Dimension) string {
	s := make([]string, len(dims))
	for i, d := range dims {
		s[i] = string(d)
	}
	return strings.Join(s, " and ")
}

func fmtTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }
