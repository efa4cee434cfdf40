package usagelog

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
)

// Small reads of usage logs and reports for other packages: the demo's
// progress and closing table, lifting a suspension, the end-to-end tests'
// check of what Stripe took.

// CountInStatus counts the usage logs of tenants in status st.
func CountInStatus(ctx context.Context, db DB, tenantIDs []uuid.UUID, st overage.BillingStatus) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE tenant_id = ANY($1) AND billing_status = $2`,
		tenantIDs, st).Scan(&n); err != nil {
		return 0, fmt.Errorf("count %s usage logs: %w", st, err)
	}
	return n, nil
}

// CountRunByStatus counts the usage logs of tenants whose request_id
// starts with prefix (one run of the demo), by tenant and billing status.
func CountRunByStatus(ctx context.Context, db DB, tenantIDs []uuid.UUID, prefix string) (map[uuid.UUID]map[overage.BillingStatus]int64, error) {
	rows, err := db.Query(ctx, `SELECT tenant_id, billing_status, count(*) FROM usage_logs
		WHERE tenant_id = ANY($1) AND request_id LIKE $2 GROUP BY 1, 2`, tenantIDs, likePrefix(prefix))
	if err != nil {
		return nil, fmt.Errorf("count usage logs by status: %w", err)
	}
	out := map[uuid.UUID]map[overage.BillingStatus]int64{}
	var id uuid.UUID
	var status overage.BillingStatus
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &status, &n}, func() error {
		if out[id] == nil {
			out[id] = map[overage.BillingStatus]int64{}
		}
		out[id][status] = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count usage logs by status: %w", err)
	}
	return out, nil
}

// HasPending reports whether the tenant has a pending usage log: one
// probe of the pending index.
func HasPending(ctx context.Context, db DB, tenantID uuid.UUID) (bool, error) {
	var waiting bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM usage_logs WHERE tenant_id = $1 AND billing_status = 'pending')`, tenantID).Scan(&waiting); err != nil {
		return false, fmt.Errorf("find the pending usage logs of tenant %s: %w", tenantID, err)
	}
	return waiting, nil
}

// SentReport is a report as the event Stripe took was formed: its value,
// timestamp and state.
type SentReport struct {
	Value     int64
	Timestamp time.Time
	State     ReportState
}

// ReportByKey reads the report whose meter event identifier is key
// (Report.Key). It compares every report's key: for tests, not for a
// table of millions. pgx.ErrNoRows: no report has the key.
func ReportByKey(ctx context.Context, db DB, key string) (SentReport, error) {
	var r SentReport
	if err := db.QueryRow(ctx, `SELECT value, ts, state FROM usage_reports
			WHERE 'usage-log:' || lead_usage_log_id || ':' || dimension = $1`, key).Scan(&r.Value, &r.Timestamp, &r.State); err != nil {
		return r, fmt.Errorf("report %s: %w", key, err)
	}
	return r, nil
}
