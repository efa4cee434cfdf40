package usagelog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
)

// ReviewLog is a usage log as an operator's decision finds it, with the
// database clock's view of its idempotency window.
type ReviewLog struct {
	Status         overage.BillingStatus
	Message        *string
	FirstAttemptAt *time.Time
	Overage        overage.Overage
	Accepted       map[overage.Dimension]bool
	// Leads are the leads of the reports carrying each dimension (nil
	// where the log is in none).
	Leads map[overage.Dimension]*uuid.UUID
	Now   time.Time
	// WindowEndsAt is when Stripe forgets the keys of the first attempt;
	// InsideWindow says it has not yet, by the database clock.
	WindowEndsAt *time.Time
	InsideWindow bool
}

// Reviewable reports whether an operator may resolve the log.
func (l *ReviewLog) Reviewable() bool {
	return l.Status == overage.BillingStatusNeedsReview || l.Status == overage.BillingStatusFailed
}

// Key is the identifier of the meter event carrying dimension d of the log.
func (l *ReviewLog) Key(id uuid.UUID, d overage.Dimension) string {
	if lead := l.Leads[d]; lead != nil {
		return overage.MeterEventKey(*lead, d)
	}
	return overage.MeterEventKey(id, d)
}

// LockForReview reads the log FOR UPDATE in tx: the worker, the sweep and
// another operator wait for tx, then see what it decided. pgx.ErrNoRows
// means there is no such log.
func (s *Store) LockForReview(ctx context.Context, tx pgx.Tx, id uuid.UUID, window time.Duration) (*ReviewLog, error) {
	l := &ReviewLog{Accepted: map[overage.Dimension]bool{}, Leads: map[overage.Dimension]*uuid.UUID{}}
	var inAt, outAt *time.Time
	var inLead, outLead *uuid.UUID
	if err := planSettings(ctx, tx); err != nil {
		return nil, err
	}
	err := tx.QueryRow(ctx, lockForReviewSQL, id, window.Seconds()).
		Scan(&l.Status, &l.Message, &l.FirstAttemptAt, &l.Overage.InputTokens, &l.Overage.OutputTokens, &inAt, &outAt, &inLead, &outLead,
			&l.Now, &l.WindowEndsAt, &l.InsideWindow)
	if err != nil {
		return nil, err
	}
	l.Accepted[overage.DimensionInput], l.Accepted[overage.DimensionOutput] = inAt != nil, outAt != nil
	l.Leads[overage.DimensionInput], l.Leads[overage.DimensionOutput] = inLead, outLead
	return l, nil
}

// reportStateFor is the state an operator's decision gives the reports of a
// log under review.
var reportStateFor = map[overage.BillingStatus]ReportState{
	overage.BillingStatusBilled:      ReportAccepted,
	overage.BillingStatusNotBillable: ReportVoid,
	overage.BillingStatusPending:     ReportOpen,
}

// ResolveTx applies an operator's decision, in tx, to the usage log id
// (locked by LockForReview) and to its reports under review or failed: a
// report is one meter event, so a decision on it is a decision on every
// member. to is billed (Stripe holds it: the reports are accepted), not_billable
// (void: never billed) or pending (resend: the reports are open again with
// the same members, value and key, and a new first attempt, so the window
// counts afresh). Members under review or failed follow; it returns them,
// the named log first.
func (s *Store) ResolveTx(ctx context.Context, tx pgx.Tx, id uuid.UUID, to overage.BillingStatus, message string) ([]uuid.UUID, error) {
	state, ok := reportStateFor[to]
	if !ok {
		return nil, fmt.Errorf("resolve usage log %s: %s is not a decision", id, to)
	}
	if err := planSettings(ctx, tx); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, resolveReportsSQL, id, string(state), message)
	if err != nil {
		return nil, fmt.Errorf("resolve reports of usage log %s: %w", id, err)
	}
	lists, err := pgx.CollectRows(rows, pgx.RowTo[[]uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("resolve reports of usage log %s: %w", id, err)
	}
	members := []uuid.UUID{id}
	seen := map[uuid.UUID]bool{id: true}
	for _, l := range lists {
		for _, m := range l {
			if !seen[m] {
				seen[m] = true
				members = append(members, m)
			}
		}
	}
	// A resend starts a new window with the next send: a log in a report
	// takes the report's new first attempt; one in none is stamped again
	// when it joins one.
	rows, err = tx.Query(ctx, resolveLogsSQL, members, string(to), message)
	if err != nil {
		return nil, fmt.Errorf("resolve usage log %s as %s: %w", id, to, err)
	}
	changed, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("resolve usage log %s as %s: %w", id, to, err)
	}
	out := []uuid.UUID{id}
	for _, m := range changed {
		if m != id {
			out = append(out, m)
		}
	}
	if len(changed) == 0 {
		return nil, errors.New("resolve: the usage log changed under its lock")
	}
	return out, nil
}

// TenantOf returns the tenant of a usage log. In a transaction of the
// store's (after LockForReview or ResolveTx) it is planned for each
// execution; a DB of its own should be such a transaction too.
func (s *Store) TenantOf(ctx context.Context, db DB, id uuid.UUID) (uuid.UUID, error) {
	var t uuid.UUID
	if err := db.QueryRow(ctx, tenantOfSQL, id).Scan(&t); err != nil {
		return uuid.Nil, fmt.Errorf("tenant of usage log %s: %w", id, err)
	}
	return t, nil
}

// resolveReportsSQL gives state $2 and message $3 to the reports under
// review or failed that carry a line of the log $1: its (dimension, lead)
// pairs, each a probe of the reports' primary key. (An OR of the three
// ways a report carries the log, as it was, is no index condition: it read
// every report.)
const resolveReportsSQL = `UPDATE usage_reports r SET state = $2, lease_until = NULL, message = $3,
			accepted_at = CASE WHEN $2 = 'accepted' THEN now() ELSE r.accepted_at END,
			first_attempt_at = CASE WHEN $2 = 'open' THEN now() ELSE r.first_attempt_at END
		FROM usage_logs u
		CROSS JOIN LATERAL (
			SELECT 'input'::text, u.input_report_lead WHERE u.input_report_lead IS NOT NULL
			UNION ALL SELECT 'output', u.output_report_lead WHERE u.output_report_lead IS NOT NULL
			UNION ALL SELECT x.k, x.l FROM unnest(u.meter_keys, u.meter_leads) AS x (k, l) WHERE x.l IS NOT NULL
		) AS c (dimension, lead)
		WHERE u.id = $1 AND r.lead_usage_log_id = c.lead AND r.dimension = c.dimension
			AND r.state IN ('needs_review', 'failed')
		RETURNING r.member_ids`

// resolveLogsSQL gives status $2 and message $3 to the logs $1 under
// review or failed.
const resolveLogsSQL = `UPDATE usage_logs SET billing_status = $2, billing_message = $3, updated_at = now(),
			billed_at = CASE $2 WHEN 'billed' THEN now() WHEN 'pending' THEN NULL ELSE billed_at END,
			first_attempt_at = CASE WHEN $2 <> 'pending' THEN first_attempt_at
				WHEN input_report_lead IS NULL AND output_report_lead IS NULL AND meter_leads IS NULL THEN NULL ELSE now() END
		WHERE id = ANY($1) AND billing_status IN ('needs_review', 'failed')
		RETURNING id`

// lockForReviewSQL reads and locks the log $1, with its window of $2 seconds.
var lockForReviewSQL = `SELECT billing_status, billing_message, first_attempt_at,
			` + OverageInputSQL("") + `, ` + OverageOutputSQL("") + `, input_accepted_at, output_accepted_at, input_report_lead, output_report_lead,
			now(), first_attempt_at + make_interval(secs => $2),
			coalesce(first_attempt_at + make_interval(secs => $2) > now(), false)
		FROM usage_logs WHERE id = $1 FOR UPDATE`

// tenantOfSQL is the tenant of the log $1.
const tenantOfSQL = TenantOfLogSQL
