package finance

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/overage-billing/overage"
)

// MeterError is one billing.meter.error_report_triggered event Stripe sent:
// meter events Stripe could not apply, which finance must see.
type MeterError struct {
	MeterID    *string    `json:"meter_id"`
	Summary    *string    `json:"summary"`
	ErrorCount *int64     `json:"error_count"`
	ReportedAt *time.Time `json:"reported_at"`
	ReceivedAt time.Time  `json:"received_at"`
}

// MeterErrors returns the most recent meter error reports, newest first.
func MeterErrors(ctx context.Context, db overage.DB, limit int) ([]MeterError, error) {
	rows, err := db.Query(ctx, `SELECT meter_id, summary, error_count, reported_at, created_at
		FROM meter_error_reports ORDER BY created_at DESC LIMIT $1`, limit)
	if err != nil {
		return nil, dbError(fmt.Errorf("read meter error reports: %w", err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (MeterError, error) {
		var m MeterError
		err := r.Scan(&m.MeterID, &m.Summary, &m.ErrorCount, &m.ReportedAt, &m.ReceivedAt)
		return m, err
	})
	if err != nil {
		return nil, dbError(fmt.Errorf("read meter error reports: %w", err))
	}
	return out, nil
}

// WriteMeterErrors prints meter error reports as a table.
func WriteMeterErrors(w io.Writer, errs []MeterError) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STRIPE METER ERROR REPORTS\tMETER\tERRORS\tSUMMARY")
	str := func(s *string) string {
		if s == nil {
			return "-"
		}
		return *s
	}
	for _, m := range errs {
		at := m.ReceivedAt
		if m.ReportedAt != nil {
			at = *m.ReportedAt
		}
		n := "-"
		if m.ErrorCount != nil {
			n = fmt.Sprint(*m.ErrorCount)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", at.UTC().Format(time.RFC3339), str(m.MeterID), n, str(m.Summary))
	}
	return tw.Flush()
}
