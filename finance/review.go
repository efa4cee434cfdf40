package finance

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage/usagelog"
)

// ReviewLog is a usage log in needs_review: its first send to Stripe is
// older than Stripe's idempotency window, so it is not resent
// automatically; an operator decides whether Stripe has it.
type ReviewLog struct {
	ID                  uuid.UUID  `json:"id"`
	TenantID            uuid.UUID  `json:"tenant_id"`
	TenantName          string     `json:"tenant_name"`
	StripeCustomerID    string     `json:"stripe_customer_id"`
	CreatedAt           time.Time  `json:"created_at"`
	FirstAttemptAt      *time.Time `json:"first_attempt_at"`
	OverageInputTokens  int64      `json:"overage_input_tokens"`
	OverageOutputTokens int64      `json:"overage_output_tokens"`
	Message             string     `json:"billing_message"`
}

// NeedsReview lists up to limit usage logs in needs_review, of one tenant
// when tenantID is set, by tenant name then age — the list the spec's
// "overage status lists such logs" asks for. It is not part of the Report
// (the JSON contract has no such field); the CLI prints it under the
// table. It visits only tenants whose counters say they have such logs,
// through the (tenant_id, billing_status) index.
func NeedsReview(ctx context.Context, db DB, tenantID *uuid.UUID, limit int) ([]ReviewLog, error) {
	if limit <= 0 {
		return []ReviewLog{}, nil
	}
	rows, err := db.Query(ctx, `
		SELECT u.id, t.id, t.name, t.stripe_customer_id, u.created_at, u.first_attempt_at,
			u.overage_input_tokens, u.overage_output_tokens, coalesce(u.billing_message, '')
		FROM (
			-- Counters are spread over slots: a tenant has such logs when
			-- its slots sum above zero (one slot alone may be negative).
			SELECT tenant_id FROM billing_counters
			WHERE `+usagelog.Is("billing_status", usagelog.StatusNeedsReview)+` AND ($1::uuid IS NULL OR tenant_id = $1::uuid)
			GROUP BY tenant_id HAVING sum(usage_logs) > 0
		) c
		JOIN tenants t ON t.id = c.tenant_id
		CROSS JOIN LATERAL (
			SELECT * FROM usage_logs u
			WHERE u.tenant_id = c.tenant_id AND `+usagelog.Is("u.billing_status", usagelog.StatusNeedsReview)+`
			ORDER BY u.created_at, u.id LIMIT $2
		) u
		ORDER BY t.name, t.id, u.created_at, u.id
		LIMIT $2`, tenantID, limit)
	if err != nil {
		return nil, dbError(fmt.Errorf("read usage logs in review: %w", err))
	}
	defer rows.Close()
	out := []ReviewLog{}
	for rows.Next() {
		var l ReviewLog
		if err := rows.Scan(&l.ID, &l.TenantID, &l.TenantName, &l.StripeCustomerID, &l.CreatedAt, &l.FirstAttemptAt,
			&l.OverageInputTokens, &l.OverageOutputTokens, &l.Message); err != nil {
			return nil, dbError(fmt.Errorf("read usage logs in review: %w", err))
		}
		l.CreatedAt = l.CreatedAt.UTC()
		if l.FirstAttemptAt != nil {
			t := l.FirstAttemptAt.UTC()
			l.FirstAttemptAt = &t
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError(fmt.Errorf("read usage logs in review: %w", err))
	}
	return out, nil
}

// WriteNeedsReview writes logs as an aligned table; nothing when empty.
func WriteNeedsReview(w io.Writer, logs []ReviewLog) error {
	if len(logs) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "USAGE LOG IN REVIEW\tTENANT\tCREATED\tFIRST SENT\tOVERAGE IN\tOVERAGE OUT\tWHY")
	for _, l := range logs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", l.ID, l.TenantName, l.CreatedAt.Format(time.RFC3339),
			oldest(l.FirstAttemptAt), l.OverageInputTokens, l.OverageOutputTokens, l.Message)
	}
	return tw.Flush()
}
