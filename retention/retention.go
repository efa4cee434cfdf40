// Package retention decides which raw usage logs go, and makes them go:
// a usage_logs partition whose whole range is older than
// USAGE_LOG_RETENTION, every log in it final, no open report among its
// reports and every (tenant, period) of its logs closed, is rolled up
// into usage_rollups (finance and reconcile read them for the days whose
// logs are gone) and dropped, with its reports' partition. Partitions go
// oldest first only, so one watermark (an id) separates the logs read
// from rollups from those read from usage_logs.
//
// `overage retention [--dry-run]` runs it once; `overage work` daily. The
// tables are usagelog's: this package holds the rule and the order of
// the steps.
package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/usagelog"
)

// DefaultRetention is USAGE_LOG_RETENTION's default: a year and a
// month's margin, so a year-on-year comparison still reads raw logs.
const DefaultRetention = 400 * 24 * time.Hour

// Config is what a run needs.
type Config struct {
	// Retention is USAGE_LOG_RETENTION; 0 keeps every log.
	Retention time.Duration
	// CloseGrace is PERIOD_CLOSE_GRACE (usagelog.DefaultPeriodCloseGrace
	// when 0).
	CloseGrace time.Duration
	Logger     *slog.Logger
}

// Action is what a run does, or would do, with a partition.
type Action string

const (
	// ActionKept: the partition stays (Reason says why).
	ActionKept Action = "kept"
	// ActionRollUp: a dry run's "would roll up and drop".
	ActionRollUp Action = "roll_up_and_drop"
	// ActionDropped: rolled up and dropped by this run (or the drop of an
	// earlier run's roll-up finished).
	ActionDropped Action = "dropped"
)

// Decision is one partition's line of a run.
type Decision struct {
	Partition string     `json:"partition"`
	Reports   string     `json:"reports_partition"`
	From      *time.Time `json:"from"`
	To        time.Time  `json:"to"`
	Action    Action     `json:"action"`
	Reason    string     `json:"reason"`
	// Logs is the number of logs rolled up (or that would be), when read.
	Logs *int64 `json:"logs,omitempty"`
	// Indexes is a kept partition's packing (usagelog.PackPartition);
	// empty for a partition that goes.
	Indexes Packing `json:"indexes,omitempty"`
	// PackedAt is when its indexes were packed.
	PackedAt *time.Time `json:"packed_at,omitempty"`
	// IndexBytes is the size of its indexes (both tables) before and
	// after this run packed them.
	IndexBytes *[2]int64 `json:"index_bytes,omitempty"`
	// HeapBytes is the size of its logs' heap before and after this run
	// rewrote it.
	HeapBytes *[2]int64 `json:"heap_bytes,omitempty"`
}

// Packing is where a kept partition stands in its packing: its logs'
// heap rewritten and its indexes rebuilt full, once, when its month is
// over and none of its logs is pending (usagelog.PackPartition).
type Packing string

const (
	// PackingOpen: logs may still enter it (its month and
	// usagelog.PackAfter are not over).
	PackingOpen Packing = "open"
	// PackingPending: logs of it are pending, and billing will update
	// them.
	PackingPending Packing = "pending"
	// PackingDue: a dry run's "would pack".
	PackingDue Packing = "would_pack"
	// PackingPacked: packed, by this run (IndexBytes) or an earlier one.
	PackingPacked Packing = "packed"
)

// Result is a run: every partition, oldest first.
type Result struct {
	DryRun    bool   `json:"dry_run"`
	Retention string `json:"retention"`
	// Watermark: the logs with ids below it are read from usage_rollups
	// (recorded before WatermarkAt); null while nothing is rolled up.
	Watermark   *string    `json:"watermark"`
	WatermarkAt *time.Time `json:"watermark_at"`
	Partitions  []Decision `json:"partitions"`
}

// Dropped counts the partitions the run dropped.
func (r *Result) Dropped() int {
	n := 0
	for _, d := range r.Partitions {
		if d.Action == ActionDropped {
			n++
		}
	}
	return n
}

// ErrBusy: another run holds the retention lock.
var ErrBusy = errors.New("another retention run is in progress")

// lockID serialises runs ("ovg-rtnt" read as a big-endian integer).
const lockID int64 = 0x6f76672d72746e74

// Run weighs every partition, oldest first, and unless dryRun rolls up
// and drops those that may go. A dry run reads and changes nothing
// (it takes no lock either). An earlier run interrupted between its
// roll-up and its drop is finished first. Without dryRun, a run that
// finds another in progress returns ErrBusy.
func Run(ctx context.Context, pool *pgxpool.Pool, cfg Config, dryRun bool) (*Result, error) {
	if cfg.CloseGrace == 0 {
		cfg.CloseGrace = usagelog.DefaultPeriodCloseGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	defer conn.Release()
	if !dryRun {
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, lockID).Scan(&got); err != nil {
			return nil, fmt.Errorf("retention: lock: %w", err)
		}
		if !got {
			return nil, ErrBusy
		}
		defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lockID) }()
	}
	res := &Result{DryRun: dryRun, Retention: FormatRetention(cfg.Retention), Partitions: []Decision{}}

	rolled, err := usagelog.ListRolledUp(ctx, conn)
	if err != nil {
		return nil, err
	}
	done := map[string]usagelog.RolledUp{}
	for _, r := range rolled {
		if r.DroppedAt != nil {
			continue
		}
		if dryRun {
			done[r.Partition] = r
			continue
		}
		if err := usagelog.DropRolledUp(ctx, conn, r); err != nil {
			return nil, err
		}
		cfg.Logger.InfoContext(ctx, "usage log partition dropped (rolled up by an earlier run)", "partition", r.Partition, "logs", r.Logs)
		logs := r.Logs
		res.Partitions = append(res.Partitions, Decision{Partition: r.Partition, Reports: r.ReportsPartition, To: r.BelowAt,
			Action: ActionDropped, Reason: "rolled up on " + r.RolledUpAt.UTC().Format(time.RFC3339) + "; drop finished", Logs: &logs})
	}

	ps, err := listPartitions(ctx, conn)
	if err != nil {
		return nil, err
	}
	var now time.Time
	if err := conn.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, fmt.Errorf("retention: read the database clock: %w", err)
	}
	packs, err := usagelog.Packs(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	var kept string // the first partition kept: every later one stays too
	packed := false // a run packs one partition at most
	for _, p := range ps {
		d := Decision{Partition: p.Name, Reports: p.Reports, From: p.Lower, To: p.Upper, Action: ActionKept}
		if r, ok := done[p.Name]; ok {
			logs := r.Logs
			d.Action, d.Reason, d.Logs = ActionRollUp, "rolled up on "+r.RolledUpAt.UTC().Format(time.RFC3339)+"; its drop is to be finished", &logs
			res.Partitions = append(res.Partitions, d)
			continue
		}
		switch {
		case cfg.Retention == 0:
			d.Reason = "USAGE_LOG_RETENTION=0 keeps every log"
		case p.Upper.After(now.Add(-cfg.Retention)):
			d.Reason = "newer than " + res.Retention
		case kept != "":
			d.Reason = "an older partition (" + kept + ") is kept: partitions go oldest first"
		default:
			if err := weigh(ctx, conn, cfg, p, dryRun, &d); err != nil {
				return res, err
			}
		}
		if d.Action == ActionKept {
			if kept == "" {
				kept = p.Name
			}
			if err := pack(ctx, conn, cfg, p, now, packs, dryRun || packed, &d); err != nil {
				return res, err
			}
			packed = packed || d.IndexBytes != nil
		}
		res.Partitions = append(res.Partitions, d)
	}
	w, err := usagelog.Watermark(ctx, conn)
	if err != nil {
		return res, err
	}
	if w != uuid.Nil {
		ws, at := w.String(), usagelog.IDTime(w)
		res.Watermark, res.WatermarkAt = &ws, &at
	}
	return res, nil
}

// weigh reads what keeps p and, unless dryRun, rolls it up and drops it.
// The read and the roll-up are one repeatable-read transaction: the
// roll-up sums exactly the logs found final. Final logs never change
// (review resolves only logs under review or failed; corrections are new
// logs, with new ids) and a partition older than the retention receives
// no new log, so nothing can change under the roll-up: it takes no lock
// that would stop a writer.
func weigh(ctx context.Context, conn *pgxpool.Conn, cfg Config, p Partition, dryRun bool, d *Decision) error {
	opts := pgx.TxOptions{IsoLevel: pgx.RepeatableRead}
	if dryRun {
		opts.AccessMode = pgx.ReadOnly
	}
	rolled := false
	err := pgx.BeginTxFunc(ctx, conn, opts, func(tx pgx.Tx) error {
		s, err := usagelog.ReadPartitionState(ctx, tx, p.Name, p.Reports, cfg.CloseGrace)
		if err != nil {
			return err
		}
		if why := keptBecause(s); why != "" {
			d.Reason = why
			return nil
		}
		logs := s.Logs
		d.Logs = &logs
		d.Reason = "older than " + FormatRetention(cfg.Retention) + ", every log final, no open report, every period closed"
		if dryRun {
			d.Action = ActionRollUp
			return nil
		}
		rolled = true
		return usagelog.RollUpTx(ctx, tx, usagelog.RollUp{Partition: p.Name, ReportsPartition: p.Reports,
			Below: p.UpperID, BelowAt: p.Upper, Logs: s.Logs})
	})
	if err != nil {
		return fmt.Errorf("retention of %s: %w", p.Name, err)
	}
	if !rolled {
		return nil
	}
	cfg.Logger.InfoContext(ctx, "usage log partition rolled up", "partition", p.Name, "logs", *d.Logs)
	if err := usagelog.DropRolledUp(ctx, conn, usagelog.RolledUp{Partition: p.Name, ReportsPartition: p.Reports}); err != nil {
		return fmt.Errorf("retention of %s (rolled up; the next run finishes the drop): %w", p.Name, err)
	}
	cfg.Logger.InfoContext(ctx, "usage log partition dropped", "partition", p.Name, "reports_partition", p.Reports)
	d.Action = ActionDropped
	return nil
}

// pack weighs a kept partition's packing and, unless dryRun, packs it
// when it is due. Packing is retention's, though it drops nothing: both
// are what a month's partition becomes once it is written no more, and
// retention's lock keeps two packs of one partition apart. A run packs
// one partition at most (Run passes dryRun for the others, which stay
// due): a month's rebuild reads and writes all its indexes, and the
// first run after an upgrade finds every month kept due, which daily
// runs then pack one a day, oldest first, rather than all at once.
func pack(ctx context.Context, conn *pgxpool.Conn, cfg Config, p Partition, now time.Time, packs map[string]usagelog.Pack,
	dryRun bool, d *Decision) error {
	if done, ok := packs[p.Name]; ok {
		at := done.PackedAt
		d.Indexes, d.PackedAt = PackingPacked, &at
		return nil
	}
	if p.Upper.After(now.Add(-usagelog.PackAfter)) {
		d.Indexes = PackingOpen
		return nil
	}
	pending, err := usagelog.PendingIn(ctx, conn, p.Name)
	if err != nil {
		return fmt.Errorf("retention of %s: %w", p.Name, err)
	}
	switch {
	case pending:
		d.Indexes = PackingPending
		return nil
	case dryRun:
		d.Indexes = PackingDue
		return nil
	}
	start := time.Now()
	done, err := usagelog.PackPartition(ctx, conn.Conn(), p)
	if err != nil {
		return fmt.Errorf("retention of %s: %w", p.Name, err)
	}
	cfg.Logger.InfoContext(ctx, "usage log partition packed", "partition", p.Name, "reports_partition", p.Reports,
		"index_bytes_before", done.IndexBytesBefore, "index_bytes_after", done.IndexBytesAfter,
		"heap_bytes_before", done.HeapBytesBefore, "heap_bytes_after", done.HeapBytesAfter, "took", time.Since(start))
	d.Indexes, d.PackedAt = PackingPacked, &done.PackedAt
	d.IndexBytes = &[2]int64{done.IndexBytesBefore, done.IndexBytesAfter}
	d.HeapBytes = &[2]int64{done.HeapBytesBefore, done.HeapBytesAfter}
	return nil
}

// keptBecause says what in s keeps its partition, "" when nothing does.
func keptBecause(s *usagelog.PartitionState) string {
	if len(s.NotFinal) > 0 {
		var parts []string
		var total int64
		for _, st := range usagelog.Statuses {
			if n := s.NotFinal[st]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, st))
				total += n
			}
		}
		return fmt.Sprintf("%s not final (%s)", count(total, "log"), strings.Join(parts, ", "))
	}
	if s.OpenReports > 0 {
		return count(s.OpenReports, "open report")
	}
	if p := s.OpenPeriod; p != nil {
		return "period " + periodText(p.Start) + " of tenant " + p.TenantID.String() + " not closed"
	}
	return ""
}

// count is n things, in English.
func count(n int64, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// periodText is a period's start as a month (2026-03) when it begins one,
// else its day.
func periodText(t time.Time) string {
	t = t.UTC()
	if t.Day() == 1 && t.Equal(t.Truncate(24*time.Hour)) {
		return t.Format("2006-01")
	}
	return t.Format(time.DateOnly)
}

// FormatRetention writes d as USAGE_LOG_RETENTION does: whole days as
// "400d", 0 as "0", anything else as a Go duration.
func FormatRetention(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return d.String()
}

// ParseRetention reads USAGE_LOG_RETENTION: a number of days ("400d"), a
// Go duration ("720h") or "0" (keep every log).
func ParseRetention(v string) (time.Duration, error) {
	if v == "0" {
		return 0, nil
	}
	if n, ok := strings.CutSuffix(v, "d"); ok {
		days, err := strconv.ParseInt(n, 10, 32)
		if err == nil && days > 0 {
			return time.Duration(days) * 24 * time.Hour, nil
		}
	} else if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d, nil
	}
	return 0, errors.New("want a number of days such as 400d, a Go duration such as 720h, or 0 to keep every log")
}

// Summary is a run in a few words, for its log line: how many partitions
// were dropped, kept and packed by the run, and the first reason to keep
// one.
func (r *Result) Summary() (dropped, kept, packed int, firstKept string) {
	for _, d := range r.Partitions {
		if d.IndexBytes != nil {
			packed++
		}
		switch d.Action {
		case ActionDropped:
			dropped++
		case ActionKept:
			if kept == 0 {
				firstKept = d.Partition + ": " + d.Reason
			}
			kept++
		}
	}
	return dropped, kept, packed, firstKept
}
