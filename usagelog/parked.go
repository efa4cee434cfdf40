package usagelog

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
)

// Parked is a usage log waiting for an operator (needs_review or failed),
// with its tenant's name and Stripe customer: one line of review.List.
type Parked struct {
	UsageLogID          uuid.UUID
	TenantID            uuid.UUID
	TenantName          string
	StripeCustomerID    string
	Status              overage.BillingStatus
	Reason              string
	FirstAttemptAt      *time.Time
	Timestamp           time.Time
	CreatedAt           time.Time
	OverageInputTokens  int64
	OverageOutputTokens int64
	InputAcceptedAt     *time.Time
	OutputAcceptedAt    *time.Time
	InputReportLead     *uuid.UUID
	OutputReportLead    *uuid.UUID
}

// ParkedParams narrow ListParked.
type ParkedParams struct {
	// TenantID names one tenant; nil lists every tenant's.
	TenantID *uuid.UUID
	// Statuses are the statuses listed: needs_review and failed when empty.
	Statuses []overage.BillingStatus
	// Limit bounds how many logs are listed; 0 lists them all.
	Limit int
}

// ListParked returns the usage logs waiting for an operator (p narrows
// them), oldest first (by when they were recorded), times in UTC.
//
// It walks the tenants and, per tenant, the partial index of parked logs
// (migrations/0022), so it reads only the logs it returns, however large
// the table; the constant IN lets the planner prove that index applies
// whatever statuses are passed, which is why only those two may be.
func ListParked(ctx context.Context, db DB, p ParkedParams) ([]Parked, error) {
	statuses := []string{string(overage.BillingStatusNeedsReview), string(overage.BillingStatusFailed)}
	if len(p.Statuses) > 0 {
		statuses = statuses[:0]
		for _, s := range p.Statuses {
			if s != overage.BillingStatusNeedsReview && s != overage.BillingStatusFailed {
				return nil, fmt.Errorf("list usage logs to review: status %q is not one an operator reviews (needs_review, failed)", s)
			}
			statuses = append(statuses, string(s))
		}
	}
	var limit *int
	if p.Limit > 0 {
		limit = &p.Limit
	}
	rows, err := db.Query(ctx, `
		SELECT u.id, t.id, t.name, t.stripe_customer_id, u.billing_status, coalesce(u.billing_message, ''),
			u.first_attempt_at, u.ts, u.created_at, `+OverageInputSQL("u")+`, `+OverageOutputSQL("u")+`,
			u.input_accepted_at, u.output_accepted_at, u.input_report_lead, u.output_report_lead
		FROM tenants t
		CROSS JOIN LATERAL (
			SELECT * FROM usage_logs u
			WHERE u.tenant_id = t.id AND u.billing_status = ANY($2)
				AND `+In("u.billing_status", overage.BillingStatusNeedsReview, overage.BillingStatusFailed)+`
		) u
		WHERE $1::uuid IS NULL OR t.id = $1::uuid
		ORDER BY u.created_at, u.id
		LIMIT $3::int`, p.TenantID, statuses, limit)
	if err != nil {
		return nil, fmt.Errorf("list usage logs to review: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Parked, error) {
		var it Parked
		err := row.Scan(&it.UsageLogID, &it.TenantID, &it.TenantName, &it.StripeCustomerID, &it.Status, &it.Reason,
			&it.FirstAttemptAt, &it.Timestamp, &it.CreatedAt, &it.OverageInputTokens, &it.OverageOutputTokens,
			&it.InputAcceptedAt, &it.OutputAcceptedAt, &it.InputReportLead, &it.OutputReportLead)
		it.Timestamp, it.CreatedAt = it.Timestamp.UTC(), it.CreatedAt.UTC()
		it.FirstAttemptAt, it.InputAcceptedAt, it.OutputAcceptedAt = utc(it.FirstAttemptAt), utc(it.InputAcceptedAt), utc(it.OutputAcceptedAt)
		return it, err
	})
	if err != nil {
		return nil, fmt.Errorf("list usage logs to review: %w", err)
	}
	return items, nil
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
