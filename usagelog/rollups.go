package usagelog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage"
)

// Retention's statements on usage_logs partitions (package retention
// decides; this package owns the tables): what keeps a partition, its
// roll-up into usage_rollups, the watermark, and its drop.
//
// The watermark is the greatest upper bound (an id) of a partition rolled
// up: every log with an id below it is counted in usage_rollups and
// nowhere else. The roll-up and the watermark's move commit together, so
// a reader that takes the logs at or above the watermark and the rollups
// in one snapshot (Billed, CountersSQL) counts every log once, before,
// during and after a drop.

// WatermarkSQL is the watermark as SQL: the nil UUID while nothing is
// rolled up (uuid has no max(): the last entry of
// usage_rollup_partitions_below).
const WatermarkSQL = `coalesce((SELECT w.below_id FROM usage_rollup_partitions w ORDER BY w.below_id DESC LIMIT 1), '00000000-0000-0000-0000-000000000000'::uuid)`

// aboveWatermarkSQL is the condition "the log whose id is the SQL id is
// at or above the watermark" (not rolled up). It is written as a test of
// the comparison (IS TRUE), never a plain comparison on id: the planner
// would take that as an index condition of the primary key and, costing
// an unknown bound at a third of the table, read the logs by id range
// instead of the days asked through usage_logs_ts (docs/plans.md). As a
// filter it costs one comparison a row read.
func aboveWatermarkSQL(id string) string {
	return `(` + id + ` >= ` + WatermarkSQL + `) IS TRUE`
}

// Watermark reads the watermark (uuid.Nil while nothing is rolled up).
func Watermark(ctx context.Context, db DB) (uuid.UUID, error) {
	var w uuid.UUID
	if err := db.QueryRow(ctx, `SELECT `+WatermarkSQL).Scan(&w); err != nil {
		return uuid.Nil, fmt.Errorf("read the retention watermark: %w", err)
	}
	return w, nil
}

// TenantPeriod is a tenant's allowance period.
type TenantPeriod struct {
	TenantID uuid.UUID
	Start    time.Time
}

// PartitionState is what a usage_logs partition holds that retention
// weighs: its logs, those not final, its open reports and the first of
// its (tenant, period) pairs that is not closed.
type PartitionState struct {
	Logs int64
	// NotFinal counts the logs pending, needs_review and failed (review
	// resolves a log to billed, not_billable or pending: only billed and
	// not_billable are final).
	NotFinal map[overage.BillingStatus]int64
	// OpenReports counts the open reports of the reports' partition.
	OpenReports int64
	// OpenPeriod is the earliest (tenant, period) of its logs not closed,
	// nil when all are.
	OpenPeriod *TenantPeriod
}

// ReadPartitionState reads the state of the logs partition logs and of
// the reports partition reports ("" for none), grace being
// PERIOD_CLOSE_GRACE, by the database clock. The cheap index reads come
// first (the partial indexes of pending and parked logs, of open reports);
// only a partition with nothing left to bill is read whole, for its
// periods.
func ReadPartitionState(ctx context.Context, db DB, logs, reports string, grace time.Duration) (*PartitionState, error) {
	s := &PartitionState{NotFinal: map[overage.BillingStatus]int64{}}
	rel := pgx.Identifier{logs}.Sanitize()
	rows, err := db.Query(ctx, `SELECT billing_status, count(*) FROM `+rel+` WHERE `+
		In("billing_status", overage.BillingStatusPending, overage.BillingStatusNeedsReview, overage.BillingStatusFailed)+` GROUP BY 1`)
	if err != nil {
		return nil, fmt.Errorf("read the logs not final of %s: %w", logs, err)
	}
	for rows.Next() {
		var st overage.BillingStatus
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the logs not final of %s: %w", logs, err)
		}
		s.NotFinal[st] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the logs not final of %s: %w", logs, err)
	}
	if reports != "" {
		if err := db.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{reports}.Sanitize()+` WHERE state = 'open'`).Scan(&s.OpenReports); err != nil {
			return nil, fmt.Errorf("read the open reports of %s: %w", reports, err)
		}
	}
	if len(s.NotFinal) > 0 || s.OpenReports > 0 {
		return s, nil
	}
	rows, err = db.Query(ctx, `SELECT g.tenant_id, g.period_start, g.n, `+PeriodClosedSQL("g.tenant_id", "g.period_start", "$1")+`
		FROM (SELECT tenant_id, period_start, count(*) AS n FROM `+rel+` GROUP BY 1, 2) g
		ORDER BY g.period_start, g.tenant_id`, grace.Seconds())
	if err != nil {
		return nil, fmt.Errorf("read the periods of %s: %w", logs, err)
	}
	defer rows.Close()
	for rows.Next() {
		var p TenantPeriod
		var n int64
		var closed bool
		if err := rows.Scan(&p.TenantID, &p.Start, &n, &closed); err != nil {
			return nil, fmt.Errorf("read the periods of %s: %w", logs, err)
		}
		s.Logs += n
		if !closed && s.OpenPeriod == nil {
			p.Start = p.Start.UTC()
			s.OpenPeriod = &p
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the periods of %s: %w", logs, err)
	}
	return s, nil
}

// RollUp names a usage_logs partition to roll up: its reports' partition
// ("" for none), its upper bound, as an id and as a time, and how many
// logs it holds (PartitionState.Logs, read in the same transaction).
type RollUp struct {
	Partition, ReportsPartition string
	Below                       uuid.UUID
	BelowAt                     time.Time
	Logs                        int64
}

// RollUpTx adds, in tx, the sums of every log of the partition to
// usage_rollups and records the partition rolled up, which moves the
// watermark to its upper bound: both commit with tx or neither does. The
// sums are added to what is there (a day whose logs lie in two
// partitions is summed by both).
func RollUpTx(ctx context.Context, tx pgx.Tx, r RollUp) error {
	if _, err := tx.Exec(ctx, rollUpSQL(pgx.Identifier{r.Partition}.Sanitize())); err != nil {
		return fmt.Errorf("roll up %s: %w", r.Partition, err)
	}
	var reports *string
	if r.ReportsPartition != "" {
		reports = &r.ReportsPartition
		// A report goes with its lead, its oldest member: members of it
		// may be in later partitions, still kept, and billed on its day.
		if _, err := tx.Exec(ctx, `INSERT INTO usage_rollup_report_times (lead_usage_log_id, dimension, ts)
			SELECT r.lead_usage_log_id, r.dimension, r.ts FROM `+pgx.Identifier{r.ReportsPartition}.Sanitize()+` r
			WHERE EXISTS (SELECT FROM unnest(r.member_ids) AS m (id) WHERE m.id >= $1)
			ON CONFLICT DO NOTHING`, r.Below); err != nil {
			return fmt.Errorf("keep the times of the reports of %s with later members: %w", r.ReportsPartition, err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO usage_rollup_partitions (partition, reports_partition, below_id, below_at, logs)
		VALUES ($1, $2, $3, $4, $5)`, r.Partition, reports, r.Below, r.BelowAt, r.Logs); err != nil {
		return fmt.Errorf("record %s rolled up: %w", r.Partition, err)
	}
	return nil
}

// outputTypesSQL lists the token types of the output dimension, for the
// default output line's share of a log's tokens.
var outputTypesSQL = func() string {
	var q []string
	for _, t := range overage.TokenTypes {
		if t.Dimension() == overage.DimensionOutput {
			q = append(q, "'"+string(t)+"'")
		}
	}
	return strings.Join(q, ", ")
}()

// rollUpSQL sums the lines of every log of rel per (tenant, usage day,
// meter, model, billing day) into usage_rollups. A log's lines are those
// its view shows (overage.Catalog.Present): the default meters' with
// their dimension's tokens less the other meters' of that dimension (the
// meters catalog gives each its token type) and their own overage, then
// the other meters'. The billing day is Billed's (billingTimeSQL): the
// report is looked up on usage_reports, whichever partition holds it, or
// in usage_rollup_report_times once its lead's partition is gone.
func rollUpSQL(rel string) string {
	others := func(output bool) string {
		not := "NOT "
		if output {
			not = ""
		}
		return `coalesce((SELECT sum(x.t) FROM unnest(u.meter_keys, coalesce(u.meter_tokens, u.meter_overage)) AS x (k, t) JOIN meters m ON m.key = x.k
			WHERE m.token_type ` + not + `IN (` + outputTypesSQL + `)), 0)`
	}
	return `INSERT INTO usage_rollups AS r (tenant_id, day, meter, model_id, billing_day,
			logs, billed_logs, tokens, overage_tokens, billed_tokens, late_billed_tokens)
		SELECT l.tenant_id, l.day, l.meter, l.model_id, l.billing_day,
			count(*), count(*) FILTER (WHERE l.billed), sum(l.tokens), sum(l.overage),
			coalesce(sum(l.overage) FILTER (WHERE l.billed), 0), coalesce(sum(l.overage) FILTER (WHERE l.billed AND l.late), 0)
		FROM (SELECT u.tenant_id, (u.ts AT TIME ZONE 'UTC')::date AS day, d.meter, u.model_id,
				(` + fmt.Sprintf(billingTimeSQL, "d.lead", "d.meter") + ` AT TIME ZONE 'UTC')::date AS billing_day,
				d.tokens, d.overage,
				` + Is("u.billing_status", overage.BillingStatusBilled) + ` AS billed,
				coalesce(u.stripe_timestamp = 'reported', false) AS late
			FROM ` + rel + ` u
			CROSS JOIN LATERAL (
				SELECT 'input'::text AS meter, u.input_tokens - ` + others(false) + ` AS tokens, ` + OverageInputSQL("u") + ` AS overage, u.input_report_lead AS lead
				UNION ALL SELECT 'output', u.output_tokens - ` + others(true) + `, ` + OverageOutputSQL("u") + `, ` + OutputReportLeadSQL("u") + `
				UNION ALL SELECT x.k, x.t, x.o, x.l FROM unnest(u.meter_keys, coalesce(u.meter_tokens, u.meter_overage), u.meter_overage, u.meter_leads) AS x (k, t, o, l)
			) AS d) l
		GROUP BY 1, 2, 3, 4, 5
		ON CONFLICT (tenant_id, day, meter, model_id, billing_day) DO UPDATE SET
			logs = r.logs + EXCLUDED.logs, billed_logs = r.billed_logs + EXCLUDED.billed_logs,
			tokens = r.tokens + EXCLUDED.tokens, overage_tokens = r.overage_tokens + EXCLUDED.overage_tokens,
			billed_tokens = r.billed_tokens + EXCLUDED.billed_tokens, late_billed_tokens = r.late_billed_tokens + EXCLUDED.late_billed_tokens`
}

// RolledUp is a partition rolled up whose drop may be unfinished.
type RolledUp struct {
	Partition, ReportsPartition string
	Below                       uuid.UUID
	BelowAt                     time.Time
	Logs                        int64
	RolledUpAt                  time.Time
	DroppedAt                   *time.Time
}

// ListRolledUp lists the partitions rolled up, oldest first.
func ListRolledUp(ctx context.Context, db DB) ([]RolledUp, error) {
	rows, err := db.Query(ctx, `SELECT partition, coalesce(reports_partition, ''), below_id, below_at, logs, rolled_up_at, dropped_at
		FROM usage_rollup_partitions ORDER BY below_id`)
	if err != nil {
		return nil, fmt.Errorf("list the partitions rolled up: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RolledUp, error) {
		var p RolledUp
		err := r.Scan(&p.Partition, &p.ReportsPartition, &p.Below, &p.BelowAt, &p.Logs, &p.RolledUpAt, &p.DroppedAt)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("list the partitions rolled up: %w", err)
	}
	return out, nil
}

// DropRolledUp detaches and drops a partition rolled up and its reports'
// partition, then records it dropped. Each step may have been done by a
// run interrupted before: it finishes what is left.
//
// Why DETACH … CONCURRENTLY and not DROP under a lock_timeout: a plain
// DROP (or DETACH) of a partition takes ACCESS EXCLUSIVE on the parent,
// which queues behind every open transaction on usage_logs and, while it
// waits, makes every new insert queue behind it — ingest stalls for as
// long as the longest report job or finance read. With a short
// lock_timeout it would fail often under load and be retried for ever.
// DETACH CONCURRENTLY takes only SHARE UPDATE EXCLUSIVE on the parent
// (inserts, updates and reads go on) and waits, without blocking anyone,
// for the transactions that may still see the partition; the DROP that
// follows is of a table nothing references. It cannot run in a
// transaction, so db must be a connection or a pool, not a pgx.Tx. The
// logs were rolled up and the watermark moved before, so readers skip
// them from then on whatever the detach's progress.
func DropRolledUp(ctx context.Context, db DB, p RolledUp) error {
	for _, d := range []struct{ parent, part string }{{"usage_logs", p.Partition}, {"usage_reports", p.ReportsPartition}} {
		if d.part == "" {
			continue
		}
		if err := dropPartition(ctx, db, d.parent, d.part); err != nil {
			return err
		}
	}
	if _, err := db.Exec(ctx, `UPDATE usage_rollup_partitions SET dropped_at = now() WHERE partition = $1 AND dropped_at IS NULL`, p.Partition); err != nil {
		return fmt.Errorf("record %s dropped: %w", p.Partition, err)
	}
	return nil
}

// dropPartition detaches part from parent (finishing a detach left
// pending) and drops it; a partition already gone is fine.
func dropPartition(ctx context.Context, db DB, parent, part string) error {
	var attached, pending *bool
	err := db.QueryRow(ctx, `SELECT i.inhrelid IS NOT NULL, i.inhdetachpending FROM pg_class c
		LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = $1::regclass
		WHERE c.oid = to_regclass($2)`, parent, part).Scan(&attached, &pending)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // dropped already
	}
	if err != nil {
		return fmt.Errorf("read partition %s: %w", part, err)
	}
	id := pgx.Identifier{part}.Sanitize()
	if *attached {
		q := `ALTER TABLE ` + parent + ` DETACH PARTITION ` + id + ` CONCURRENTLY`
		if pending != nil && *pending {
			q = `ALTER TABLE ` + parent + ` DETACH PARTITION ` + id + ` FINALIZE`
		}
		if _, err := db.Exec(ctx, q); err != nil {
			return fmt.Errorf("detach %s from %s: %w", part, parent, err)
		}
	}
	if _, err := db.Exec(ctx, `DROP TABLE IF EXISTS `+id); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return fmt.Errorf("drop %s (%s): %w", part, pe.Code, err)
		}
		return fmt.Errorf("drop %s: %w", part, err)
	}
	return nil
}

// RolledUpCountersSQL is the rows of billing_counters that the logs below
// the watermark stood for, from usage_rollups: those logs are all billed
// or not_billable (retention drops nothing else), counted once on their
// input line. Columns as CountersSQL's.
var RolledUpCountersSQL = `SELECT tenant_id, ` + literal(overage.BillingStatusBilled) + `::text AS billing_status,
		sum(billed_logs) FILTER (WHERE meter = 'input'),
		coalesce(sum(billed_tokens) FILTER (WHERE meter = 'input'), 0), coalesce(sum(billed_tokens) FILTER (WHERE meter = 'output'), 0)
	FROM usage_rollups GROUP BY tenant_id HAVING sum(billed_logs) FILTER (WHERE meter = 'input') > 0
	UNION ALL
	SELECT tenant_id, ` + literal(overage.BillingStatusNotBillable) + `::text,
		sum(logs - billed_logs) FILTER (WHERE meter = 'input'),
		coalesce(sum(overage_tokens - billed_tokens) FILTER (WHERE meter = 'input'), 0),
		coalesce(sum(overage_tokens - billed_tokens) FILTER (WHERE meter = 'output'), 0)
	FROM usage_rollups GROUP BY tenant_id HAVING sum(logs - billed_logs) FILTER (WHERE meter = 'input') > 0`
