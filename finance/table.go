package finance

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

// WriteTable writes r as an aligned table, one line per tenant and a
// TOTAL line, for `overage status` without --json. Token columns are the
// overage (all statuses) and what of it was billed.
func WriteTable(w io.Writer, r *Statement) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	// AlignRight pads on the left: numbers line up on their last digit.
	// The text columns come first and are left-aligned by padding them to
	// their own width.
	nameW, cusW := len("TENANT"), len("STRIPE CUSTOMER")
	for _, t := range r.Tenants {
		nameW = max(nameW, utf8.RuneCountInString(t.Name))
		cusW = max(cusW, utf8.RuneCountInString(t.StripeCustomerID))
	}
	row := func(name, id, cus string, c Counters) {
		fmt.Fprintf(tw, "%-*s\t%-36s\t%-*s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n",
			nameW, name, id, cusW, cus,
			c.UsageLogs, c.Billed, c.Pending, c.NotBillable, c.NeedsReview, c.Failed,
			c.OverageInputTokens, c.OverageOutputTokens, c.BilledInputTokens, c.BilledOutputTokens,
			oldest(c.OldestPendingAt))
	}
	fmt.Fprintf(tw, "%-*s\t%-36s\t%-*s\t%s\t\n", nameW, "TENANT", "TENANT ID", cusW, "STRIPE CUSTOMER",
		strings.Join([]string{"LOGS", "BILLED", "PENDING", "NOT BILLABLE", "NEEDS REVIEW", "FAILED",
			"OVERAGE IN", "OVERAGE OUT", "BILLED IN", "BILLED OUT", "OLDEST PENDING"}, "\t"))
	for _, t := range r.Tenants {
		row(t.Name, t.TenantID.String(), t.StripeCustomerID, t.Counters)
	}
	row("TOTAL", "", "", r.Totals)
	if err := tw.Flush(); err != nil {
		return err
	}
	if n := r.Totals.NeedsReview; n > 0 {
		_, err := fmt.Fprintf(w, "\n%d usage log(s) need review: their first send to Stripe is older than the idempotency window, so they are not resent automatically; an operator decides.\n", n)
		return err
	}
	return nil
}

func oldest(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
