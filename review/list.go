package review

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/usagelog"
)

// Item is a usage log waiting for an operator: needs_review (its first send
// is older than Stripe's idempotency window allows for an automatic resend)
// or failed (Stripe refused it with an error a retry cannot fix).
type Item struct {
	UsageLogID       uuid.UUID             `json:"usage_log_id"`
	TenantID         uuid.UUID             `json:"tenant_id"`
	TenantName       string                `json:"tenant_name"`
	StripeCustomerID string                `json:"stripe_customer_id"`
	Status           overage.BillingStatus `json:"billing_status"`
	// Reason is the log's billing_message: why it is parked, or Stripe's
	// message and request id for a failure.
	Reason string `json:"reason"`
	// FirstAttemptAt is when the log was first sent; Stripe's idempotency
	// window for its keys counts from it. Null if it was never sent.
	FirstAttemptAt *time.Time `json:"first_attempt_at"`
	// Timestamp is the usage's own time (sent to Stripe); CreatedAt is when
	// the log was recorded.
	Timestamp           time.Time `json:"timestamp"`
	CreatedAt           time.Time `json:"created_at"`
	OverageInputTokens  int64     `json:"overage_input_tokens"`
	OverageOutputTokens int64     `json:"overage_output_tokens"`
	// When Stripe accepted each dimension; an accepted dimension is never
	// sent again, whatever the operator decides.
	InputAcceptedAt  *time.Time `json:"input_accepted_at"`
	OutputAcceptedAt *time.Time `json:"output_accepted_at"`
	// The leads of the reports carrying each dimension (nil where none).
	InputReportLead  *uuid.UUID `json:"-"`
	OutputReportLead *uuid.UUID `json:"-"`
}

// Identifiers are the Stripe meter event identifiers (and idempotency
// keys) of the reports carrying the item's dimensions with overage; a
// dimension in no report is named by the log's own key.
func (it Item) Identifiers() []string {
	var out []string
	key := func(lead *uuid.UUID, d overage.Dimension) string {
		if lead != nil {
			return overage.MeterEventKey(*lead, d)
		}
		return overage.MeterEventKey(it.UsageLogID, d)
	}
	if it.OverageInputTokens > 0 {
		out = append(out, key(it.InputReportLead, overage.DimensionInput))
	}
	if it.OverageOutputTokens > 0 {
		out = append(out, key(it.OutputReportLead, overage.DimensionOutput))
	}
	return out
}

// ListParams narrow List.
type ListParams struct {
	// TenantID names one tenant; nil lists every tenant's.
	TenantID *uuid.UUID
	// Statuses are the statuses listed: needs_review and failed when empty.
	Statuses []overage.BillingStatus
	// Limit bounds how many logs are listed; 0 lists them all.
	Limit int
}

// List returns the usage logs waiting for an operator (p narrows them),
// oldest first (by when they were recorded). It is the one list of them:
// `overage review list` and `overage status` both print it. It never
// returns nil, so the JSON of an empty list is []. The logs are read by
// usagelog.ListParked.
func List(ctx context.Context, db overage.DB, p ListParams) ([]Item, error) {
	parked, err := usagelog.ListParked(ctx, db, usagelog.ParkedParams{TenantID: p.TenantID, Statuses: p.Statuses, Limit: p.Limit})
	if err != nil {
		return nil, err
	}
	items := make([]Item, len(parked))
	for i, l := range parked {
		items[i] = Item(l)
	}
	return items, nil
}

// WriteTable writes items as an aligned table for an operator, one log per
// line, with the command that resolves them underneath.
func WriteTable(w io.Writer, items []Item) error {
	if len(items) == 0 {
		_, err := fmt.Fprintln(w, "No usage logs need review.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "USAGE LOG\tSTATUS\tTENANT\tCUSTOMER\tFIRST SENT\tOVERAGE IN\tOVERAGE OUT\tACCEPTED BY STRIPE\tREASON")
	for _, it := range items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", it.UsageLogID, it.Status, oneLine(it.TenantName), it.StripeCustomerID,
			timeOrDash(it.FirstAttemptAt), it.OverageInputTokens, it.OverageOutputTokens, accepted(it), oneLine(it.Reason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\n%d usage log(s). Resolve one with: overage review resolve ID --as billed|resend|void --reason TEXT\n", len(items))
	return err
}

func accepted(it Item) string {
	var dims []string
	if it.InputAcceptedAt != nil {
		dims = append(dims, string(overage.DimensionInput))
	}
	if it.OutputAcceptedAt != nil {
		dims = append(dims, string(overage.DimensionOutput))
	}
	if len(dims) == 0 {
		return "-"
	}
	return strings.Join(dims, ",")
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// oneLine keeps a free-text field from breaking the table.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
