package usagelog

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/pgplan"
)

// Is is the SQL condition "column holds status st", for the read queries of
// other packages (finance's counters, reconciliation, the demo): the status
// names are spelled here, from the typed constants, and nowhere else.
func Is(column string, st overage.BillingStatus) string {
	return column + " = " + literal(st)
}

// In is the SQL condition "column holds one of sts".
func In(column string, sts ...overage.BillingStatus) string {
	return column + " IN (" + literals(sts) + ")"
}

// NotIn is the SQL condition "column holds none of sts".
func NotIn(column string, sts ...overage.BillingStatus) string {
	return column + " NOT IN (" + literals(sts) + ")"
}

func literals(sts []overage.BillingStatus) string {
	lits := make([]string, len(sts))
	for i, st := range sts {
		lits[i] = literal(st)
	}
	return strings.Join(lits, ", ")
}

func literal(st overage.BillingStatus) string {
	for _, known := range Statuses {
		if st == known {
			return "'" + string(st) + "'"
		}
	}
	panic(fmt.Sprintf("usagelog: %q is not a billing status", st))
}

// Backlog is what is left to bill, by the database clock.
type Backlog struct {
	Pending, NeedsReview, Failed int64
	// OldestPending is the creation time of the oldest pending log, or nil.
	OldestPending *time.Time
	Now           time.Time
}

// ReadBacklog reads the backlog from the finance counters (a few rows per
// tenant) and the partial index on pending logs, so it stays cheap at
// millions of logs.
func ReadBacklog(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (Backlog, error) {
	if tb, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		var b Backlog
		err := pgx.BeginTxFunc(ctx, tb, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) (err error) {
			if _, err := tx.Exec(ctx, backlogSettingsSQL); err != nil {
				return fmt.Errorf("read billing backlog: %w", err)
			}
			b, err = readBacklog(ctx, tx)
			return err
		})
		return b, err
	}
	return readBacklog(ctx, db)
}

// backlogSettingsSQL opens the backlog's transaction: its statement has no
// parameters, so its one plan is cached on the connection for good (until
// the next ANALYZE); made while usage_logs is small, that plan would read
// the oldest pending log by a sequential scan of the whole table. JIT goes
// with the scans (pgplan.NoSeqScan): the statement still scans
// billing_counters.
const backlogSettingsSQL = `SELECT ` + pgplan.NoSeqScan

func readBacklog(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (Backlog, error) {
	var b Backlog
	err := db.QueryRow(ctx, backlogSQL).Scan(&b.Pending, &b.NeedsReview, &b.Failed, &b.OldestPending, &b.Now)
	if err != nil {
		return b, fmt.Errorf("read billing backlog: %w", err)
	}
	return b, nil
}

// backlogSQL reads the backlog.
var backlogSQL = `SELECT
			coalesce(sum(usage_logs) FILTER (WHERE ` + Is("billing_status", overage.BillingStatusPending) + `), 0)::bigint,
			coalesce(sum(usage_logs) FILTER (WHERE ` + Is("billing_status", overage.BillingStatusNeedsReview) + `), 0)::bigint,
			coalesce(sum(usage_logs) FILTER (WHERE ` + Is("billing_status", overage.BillingStatusFailed) + `), 0)::bigint,
			` + OldestPendingSQL("") + `,
			now()
		FROM billing_counters`

// CountByStatus counts the usage logs of tenants (ids as []uuid.UUID or
// []string) by billing status: the demo's progress. It reads the logs, not
// the counters.
func CountByStatus(ctx context.Context, db DB, tenantIDs any) (map[overage.BillingStatus]int64, error) {
	rows, err := db.Query(ctx, `SELECT billing_status, count(*) FROM usage_logs WHERE tenant_id = ANY($1::uuid[]) GROUP BY 1`, tenantIDs)
	if err != nil {
		return nil, fmt.Errorf("count usage logs by status: %w", err)
	}
	out := map[overage.BillingStatus]int64{}
	for rows.Next() {
		var s overage.BillingStatus
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("count usage logs by status: %w", err)
		}
		out[s] = n
	}
	return out, rows.Err()
}

// OldestPendingSQL is the SQL of the creation time of the oldest pending
// usage log of the tenant (SQL tenant; "" for every tenant), NULL for
// none: the first entry of usage_logs_tenant_pending, for the statements
// of finance's status and the metrics backlog that read it with their
// counters in one snapshot. For every tenant, that entry of each tenant
// whose counters show pending logs, one probe each: a global (created_at)
// index of pending logs answered it in one probe, but cost every pending
// log another index entry, about 50 bytes and a write at ingest and again
// at billing, for this read alone (0053 drops it).
func OldestPendingSQL(tenant string) string {
	if tenant == "" {
		return `(SELECT min(o.oldest)
		FROM (SELECT c.tenant_id FROM billing_counters c WHERE ` + Is("c.billing_status", overage.BillingStatusPending) + `
			GROUP BY c.tenant_id HAVING sum(c.usage_logs) > 0) p
		CROSS JOIN LATERAL (SELECT min(u.created_at) AS oldest FROM usage_logs u
			WHERE u.tenant_id = p.tenant_id AND ` + Is("u.billing_status", overage.BillingStatusPending) + `) o)`
	}
	return `(SELECT min(u.created_at) FROM usage_logs u WHERE u.tenant_id = ` + tenant + ` AND ` + Is("u.billing_status", overage.BillingStatusPending) + `)`
}

// CountersSQL is the counter rows of billing_counters computed from the
// logs, per tenant and status (tenant_id, billing_status, usage_logs,
// overage_input_tokens, overage_output_tokens): finance rebuilds its
// counters with it, after LockWrites.
//
// The logs below the retention watermark are counted from usage_rollups
// (RolledUpCountersSQL), those at or above it from usage_logs: one
// snapshot counts each log once, before, during and after a partition's
// drop (which fires no trigger, so the live counters keep counting the
// dropped logs as this does).
var CountersSQL = `SELECT tenant_id, billing_status, sum(n)::bigint, sum(i)::bigint, sum(o)::bigint FROM (
	SELECT tenant_id, billing_status, count(*) AS n, sum(` + OverageInputSQL("") + `) AS i, sum(` + OverageOutputSQL("") + `) AS o
	FROM usage_logs WHERE ` + aboveWatermarkSQL("id") + `
	GROUP BY tenant_id, billing_status
	UNION ALL
	` + RolledUpCountersSQL + `) c
GROUP BY tenant_id, billing_status`

// LockWrites locks usage_logs in tx against every write until tx ends
// (SHARE ROW EXCLUSIVE): readers go on, ingest and the workers wait.
func LockWrites(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `LOCK TABLE usage_logs IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		return fmt.Errorf("lock usage_logs: %w", err)
	}
	return nil
}
