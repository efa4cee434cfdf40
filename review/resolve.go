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
	"github.com/overage-billing/overage/usagelog"
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
const DefaultIdempotencyWindow = overage.StripeIdempotencyWindow

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
	// Members is how many usage logs the decision covered: the log and the
	// other members of its reports (one meter event is decided as a whole).
	Members int `json:"usage_logs"`
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
	store    *usagelog.Store
	inserter *outbox.Inserter
}

// NewResolver returns a Resolver writing to pool and queueing resends with
// inserter (REPORT_MAX_ATTEMPTS attempts per job, like ingest's).
func NewResolver(pool *pgxpool.Pool, inserter *outbox.Inserter) *Resolver {
	return &Resolver{pool: pool, store: usagelog.New(pool), inserter: inserter}
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
		l, err := r.store.LockForReview(ctx, tx, p.UsageLogID, p.IdempotencyWindow)
		if errors.Is(err, pgx.ErrNoRows) {
			return overage.NotFound("no usage log %s", p.UsageLogID)
		}
		if err != nil {
			return fmt.Errorf("read usage log %s: %w", p.UsageLogID, err)
		}
		if !l.Reviewable() {
			return overage.Errorf(overage.ECONFLICT, "not-reviewable",
				"usage log %s is %s, not needs_review or failed: only those are resolved by an operator", p.UsageLogID, l.Status)
		}
		if p.Action == ActionResend && l.InsideWindow && !p.Force {
			var keys []string
			for _, d := range overage.Dimensions {
				if l.Overage.Of(d) > 0 {
					keys = append(keys, l.Key(p.UsageLogID, d))
				}
			}
			e := overage.Errorf(overage.ECONFLICT, "resend-inside-window",
				"usage log %s was first sent at %s; Stripe may hold its keys (%s) until %s by the database clock and would answer a resend from that attempt instead of sending it; resend after %s, resolve it as billed or void, or pass --force to resend now under the same keys",
				p.UsageLogID, fmtTime(*l.FirstAttemptAt), strings.Join(keys, ", "), fmtTime(*l.WindowEndsAt), fmtTime(*l.WindowEndsAt))
			e.RetryAfter = l.WindowEndsAt.Sub(l.Now)
			return e
		}

		res = &Resolution{
			UsageLogID: p.UsageLogID, Action: p.Action, Actor: p.Actor, Reason: p.Reason,
			Forced:         p.Force && l.InsideWindow,
			PreviousStatus: l.Status, PreviousMessage: l.Message, FirstAttemptAt: utc(l.FirstAttemptAt),
			Dimensions: []overage.Dimension{},
		}
		if res.AuditID, err = uuid.NewV7(); err != nil {
			return fmt.Errorf("audit id: %w", err)
		}
		if err := tx.QueryRow(ctx, `INSERT INTO review_actions
				(id, usage_log_id, action, reason, actor, previous_status, previous_message, first_attempt_at, forced)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING created_at`,
			res.AuditID, p.UsageLogID, string(p.Action), p.Reason, p.Actor, string(l.Status), l.Message, l.FirstAttemptAt, res.Forced).
			Scan(&res.ResolvedAt); err != nil {
			return fmt.Errorf("record review of usage log %s: %w", p.UsageLogID, err)
		}
		res.ResolvedAt = res.ResolvedAt.UTC()

		switch p.Action {
		case ActionBilled:
			res.Status = overage.BillingStatusBilled
			res.Message = fmt.Sprintf("marked billed by %s: %s", p.Actor, p.Reason)
			res.Dimensions = acceptedDimensions(l)
		case ActionVoid:
			res.Status = overage.BillingStatusNotBillable
			res.Message = fmt.Sprintf("voided by %s: %s", p.Actor, p.Reason)
			res.Dimensions = acceptedDimensions(l)
			if len(res.Dimensions) > 0 {
				res.Message += fmt.Sprintf(" (Stripe had already accepted %s)", joinDims(res.Dimensions))
			}
		case ActionResend:
			res.Status = overage.BillingStatusPending
			res.Message = fmt.Sprintf("resend requested by %s: %s", p.Actor, p.Reason)
			if res.Forced {
				res.Message += " (forced inside Stripe's idempotency window)"
			}
			for _, d := range overage.Dimensions {
				if l.Overage.Of(d) > 0 && !l.Accepted[d] {
					res.Dimensions = append(res.Dimensions, d)
				}
			}
		}
		// The decision covers the log's reports, hence every member of
		// them; each member gets its own audit row.
		members, err := r.store.ResolveTx(ctx, tx, p.UsageLogID, res.Status, res.Message)
		if err != nil {
			return err
		}
		res.Members = len(members)
		if err := auditMembers(ctx, tx, res, members[1:]); err != nil {
			return err
		}
		if p.Action == ActionResend {
			tenantID, err := r.store.TenantOf(ctx, tx, p.UsageLogID)
			if err != nil {
				return err
			}
			res.ReportJob, err = queueReport(ctx, tx, r.inserter, tenantID)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func acceptedDimensions(l *usagelog.ReviewLog) []overage.Dimension {
	out := []overage.Dimension{}
	for _, d := range overage.Dimensions {
		if l.Accepted[d] {
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

// queueReport queues the tenant's report job in tx. A job already queued
// for this batch period is reused rather than doubled; a job running right
// now is no obstacle: the reopened reports are picked up by this one.
func queueReport(ctx context.Context, tx pgx.Tx, inserter *outbox.Inserter, tenantID uuid.UUID) (*QueuedJob, error) {
	res, err := inserter.InsertTenantReportTx(ctx, tx, tenantID)
	if err != nil {
		return nil, err
	}
	return &QueuedJob{ID: res.Job.ID, State: string(res.Job.State), ScheduledAt: res.Job.ScheduledAt.UTC(), Existing: res.UniqueSkippedAsDuplicate}, nil
}
