package retention

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// actionText is an action as `overage retention` prints it.
var actionText = map[Action]string{
	ActionKept:    "kept",
	ActionRollUp:  "would roll up and drop",
	ActionDropped: "rolled up and dropped",
}

// indexesText is a partition's packing as `overage retention` prints it
// (in a dry run or not: a run that packed one leaves the others due).
func indexesText(d Decision, dryRun bool) string {
	switch d.Indexes {
	case PackingOpen:
		return "open"
	case PackingPending:
		return "pending logs"
	case PackingDue:
		if !dryRun {
			return "due, next run"
		}
		return "would pack"
	case PackingPacked:
		if b := d.IndexBytes; b != nil {
			s := fmt.Sprintf("packed now, %s to %s", megabytes(b[0]), megabytes(b[1]))
			if h := d.HeapBytes; h != nil {
				s += fmt.Sprintf(" (heap %s to %s)", megabytes(h[0]), megabytes(h[1]))
			}
			return s
		}
		return "packed " + d.PackedAt.UTC().Format(time.DateOnly)
	}
	return "-"
}

// megabytes is n bytes in MB, to one decimal.
func megabytes(n int64) string {
	return fmt.Sprintf("%.1f MB", float64(n)/1e6)
}

// WriteText writes r for `overage retention` without --json: one line per
// partition, oldest first — its range of ingest time, its indexes'
// packing, what was (or would be) done and why — then the watermark.
func WriteText(w io.Writer, r *Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tFROM\tTO\tLOGS\tINDEXES\tACTION")
	for _, d := range r.Partitions {
		from := "(first)"
		if d.From != nil {
			from = d.From.UTC().Format(time.DateOnly)
		}
		logs := "-"
		if d.Logs != nil {
			logs = fmt.Sprint(*d.Logs)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s: %s\n", d.Partition, from, d.To.UTC().Format(time.DateOnly), logs, indexesText(d, r.DryRun),
			actionText[d.Action], d.Reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	mode := ""
	if r.DryRun {
		mode = " (dry run: nothing changed)"
	}
	rolled := "nothing is rolled up yet"
	if r.Watermark != nil {
		rolled = fmt.Sprintf("the logs recorded before %s (ids below %s) are read from usage_rollups", r.WatermarkAt.Format(time.RFC3339), *r.Watermark)
	}
	_, err := fmt.Fprintf(w, "\nUSAGE_LOG_RETENTION=%s; %s%s\n", r.Retention, rolled, mode)
	return err
}
