package reconcile

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Notes of difference rows in the text result.
const (
	noteMissingAtStripe = "billed in the database, not applied at Stripe"
	noteExtraAtStripe   = "applied at Stripe, not billed in the database"
	// A row holding usage of earlier days reported after its period closed.
	noteReportedLate = "database includes %d of earlier days' usage, reported late (its period was closed) and billed by Stripe on this day"
)

// WriteText prints r for a human: a header, an aligned table with the
// differences first (each naming customer, meter and day), a line saying
// which windows are too recent to judge, and the verdict.
func WriteText(w io.Writer, r *Result) error {
	ew := &errWriter{w: w}
	scope := "all tenants"
	if r.TenantID != nil {
		scope = "tenant " + r.TenantID.String()
	}
	var meters []string
	for _, m := range r.Meters {
		ids := strings.Join(m.MeterIDs, ", ")
		if ids == "" {
			ids = "no Stripe meter"
		}
		meters = append(meters, fmt.Sprintf("%s (%s)", m.EventName, ids))
	}
	ew.printf("reconciliation %s .. %s (UTC days, inclusive), %s: %d customer(s); meters %s\n",
		r.From, r.To, scope, len(r.Customers), strings.Join(meters, ", "))
	for _, m := range r.Meters {
		if len(m.MeterIDs) == 0 {
			ew.printf("warning: Stripe has no meter with event name %q; it holds nothing for %s tokens\n", m.EventName, m.Dimension)
		}
	}

	if len(r.Rows) == 0 {
		ew.printf("no billed overage in the database and no usage at Stripe in this range\n")
	} else {
		var table bytes.Buffer
		tw := tabwriter.NewWriter(&table, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "STATUS\tCUSTOMER\tMETER\tDAY\tDATABASE\tSTRIPE\tSTRIPE-DATABASE\tNOTE")
		for _, row := range r.Rows {
			note := row.Reason
			if row.Status == StatusDifference {
				note = noteExtraAtStripe
				if row.Delta < 0 {
					note = noteMissingAtStripe
				}
			}
			if row.ReportedLate != 0 {
				late := fmt.Sprintf(noteReportedLate, row.ReportedLate)
				if note != "" {
					late = note + "; " + late
				}
				note = late
			}
			delta := "0"
			if row.Delta != 0 {
				delta = fmt.Sprintf("%+d", row.Delta)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n",
				row.Status, row.Customer, row.Meter, row.Day, row.Database, row.Stripe, delta, note)
		}
		_ = tw.Flush() // writes to a bytes.Buffer cannot fail
		// An empty last column leaves the padding of the one before it.
		for _, line := range strings.SplitAfter(table.String(), "\n") {
			if line != "" {
				ew.printf("%s\n", strings.TrimRight(line, " \n"))
			}
		}
	}

	// What cannot be judged comes before the verdict, so an OK line is
	// never read without it.
	var recent []string
	if r.TooRecentFrom != "" {
		recent = append(recent, "every day from "+r.TooRecentFrom)
	}
	for _, w := range r.TooRecentWindows() {
		recent = append(recent, w+" (billing activity after the cutoff)")
	}
	if len(recent) == 0 {
		ew.printf("too recent to judge: none (settle cutoff %s, %s before the run)\n",
			r.SettleCutoff.UTC().Format("2006-01-02T15:04:05Z"), r.SettleAfterText)
	} else {
		ew.printf("too recent to judge (Stripe's summaries are eventually consistent; settle cutoff %s, %s before the run): %s\n",
			r.SettleCutoff.UTC().Format("2006-01-02T15:04:05Z"), r.SettleAfterText, strings.Join(recent, "; "))
	}
	verdict := "OK: everything judged matches"
	switch {
	case !r.OK():
		verdict = "DIFFERENT: the database and Stripe disagree"
	case !r.Judged():
		verdict = "NOT JUDGED: nothing could be compared yet"
	}
	ew.printf("%s: %d difference(s), %d match(es), %d too recent to judge\n", verdict, r.Differences, r.Matches, r.TooRecent)
	return ew.err
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) {
	fmt.Fprintf(e, format, args...)
}
