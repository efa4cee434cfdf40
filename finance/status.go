package finance

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/page"
	"github.com/overage-billing/overage/internal/pgplan"

	"github.com/overage-billing/overage/usagelog"
)

// Beginner is what RebuildCounters writes with; *pgxpool.Pool and
// *pgx.Conn satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Counters are the billed-status numbers of one tenant, or of all of them.
type Counters struct {
	UsageLogs           int64      `json:"usage_logs"`
	Billed              int64      `json:"billed"`
	Pending             int64      `json:"pending"`
	NotBillable         int64      `json:"not_billable"`
	NeedsReview         int64      `json:"needs_review"`
	Failed              int64      `json:"failed"`
	OverageInputTokens  int64      `json:"overage_input_tokens"`
	OverageOutputTokens int64      `json:"overage_output_tokens"`
	BilledInputTokens   int64      `json:"billed_input_tokens"`
	BilledOutputTokens  int64      `json:"billed_output_tokens"`
	OldestPendingAt     *time.Time `json:"oldest_pending_at"`
	// Meters is the overage per meter: the default meters first, then
	// every other meter with overage. The dimension sums above include
	// every meter of their dimension.
	Meters []MeterCounters `json:"meters"`
}

// MeterCounters are one meter's overage and the part of it billed.
type MeterCounters struct {
	Meter         string `json:"meter"`
	OverageTokens int64  `json:"overage_tokens"`
	BilledTokens  int64  `json:"billed_tokens"`
}

// addMeter adds a meter's numbers into c's line of it.
func (c *Counters) addMeter(m MeterCounters) {
	for i := range c.Meters {
		if c.Meters[i].Meter == m.Meter {
			c.Meters[i].OverageTokens += m.OverageTokens
			c.Meters[i].BilledTokens += m.BilledTokens
			return
		}
	}
	c.Meters = append(c.Meters, m)
}

// defaultMeters sets c's lines of the default meters from its dimension
// sums, which hold only those meters' until addExtraMeters runs.
func (c *Counters) defaultMeters() {
	c.Meters = []MeterCounters{
		{Meter: overage.MeterInput, OverageTokens: c.OverageInputTokens, BilledTokens: c.BilledInputTokens},
		{Meter: overage.MeterOutput, OverageTokens: c.OverageOutputTokens, BilledTokens: c.BilledOutputTokens},
	}
}

// extraMetersQuery reads the overage of the meters other than the
// defaults from period_counters (per tenant, period, meter, status and
// slot: the same counters GET /v1/usage reads), with each meter's token
// type. %s filters tenants.
const extraMetersQuery = `
SELECT c.tenant_id, c.meter, m.token_type, sum(c.overage_tokens)::bigint,
	coalesce(sum(c.overage_tokens) FILTER (WHERE c.billing_status = 'billed'), 0)::bigint
FROM period_counters c JOIN meters m ON m.key = c.meter
WHERE c.meter NOT IN ('input', 'output') %s
GROUP BY 1, 2, 3
HAVING sum(c.overage_tokens) <> 0
ORDER BY 2`

// addExtraMeters adds the meters other than the defaults to the statement's
// tenants (all of them when all, else those listed) and totals: a line
// each, and their tokens to their dimension's sums.
func addExtraMeters(ctx context.Context, db overage.DB, r *Statement, all bool) error {
	byID := map[uuid.UUID]*Counters{}
	ids := make([]uuid.UUID, 0, len(r.Tenants))
	for i := range r.Tenants {
		r.Tenants[i].defaultMeters()
		byID[r.Tenants[i].TenantID] = &r.Tenants[i].Counters
		ids = append(ids, r.Tenants[i].TenantID)
	}
	if all {
		r.Totals.defaultMeters()
	}
	var rows pgx.Rows
	var err error
	if all {
		rows, err = db.Query(ctx, fmt.Sprintf(extraMetersQuery, ""))
	} else {
		rows, err = db.Query(ctx, fmt.Sprintf(extraMetersQuery, "AND c.tenant_id = ANY($1)"), ids)
	}
	if err != nil {
		return fmt.Errorf("read meter counters: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var m MeterCounters
		var tt overage.TokenType
		if err := rows.Scan(&id, &m.Meter, &tt, &m.OverageTokens, &m.BilledTokens); err != nil {
			return fmt.Errorf("read meter counters: %w", err)
		}
		add := func(c *Counters) {
			c.addMeter(m)
			if tt.Dimension() == overage.DimensionOutput {
				c.OverageOutputTokens += m.OverageTokens
				c.BilledOutputTokens += m.BilledTokens
			} else {
				c.OverageInputTokens += m.OverageTokens
				c.BilledInputTokens += m.BilledTokens
			}
		}
		if c, ok := byID[id]; ok {
			add(c)
		}
		if all {
			add(&r.Totals)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read meter counters: %w", err)
	}
	if !all {
		// The totals are the listed tenants' (Status of one tenant).
		r.Totals = Counters{}
		for _, s := range r.Tenants {
			r.Totals.add(s.Counters)
		}
	}
	return nil
}

// add adds o into c; OldestPendingAt becomes the earlier of the two.
func (c *Counters) add(o Counters) {
	c.UsageLogs += o.UsageLogs
	c.Billed += o.Billed
	c.Pending += o.Pending
	c.NotBillable += o.NotBillable
	c.NeedsReview += o.NeedsReview
	c.Failed += o.Failed
	c.OverageInputTokens += o.OverageInputTokens
	c.OverageOutputTokens += o.OverageOutputTokens
	c.BilledInputTokens += o.BilledInputTokens
	c.BilledOutputTokens += o.BilledOutputTokens
	if len(c.Meters) == 0 && len(o.Meters) > 0 {
		c.Meters = []MeterCounters{}
	}
	for _, m := range o.Meters {
		c.addMeter(m)
	}
	if o.OldestPendingAt != nil && (c.OldestPendingAt == nil || o.OldestPendingAt.Before(*c.OldestPendingAt)) {
		t := *o.OldestPendingAt
		c.OldestPendingAt = &t
	}
}

// TenantStatus is one tenant's line of the statement; the counters are
// flattened into it in JSON.
type TenantStatus struct {
	TenantID         uuid.UUID `json:"tenant_id"`
	Name             string    `json:"name"`
	StripeCustomerID string    `json:"stripe_customer_id"`
	Counters
}

// Statement is the finance statement: every tenant (those without usage logs too,
// with zeros), sorted by name then id, and the totals over them. Its JSON
// is the body of GET /v1/billing/status and the output of
// `overage status --json`.
type Statement struct {
	Tenants []TenantStatus `json:"tenants"`
	Totals  Counters       `json:"totals"`
	// NextCursor continues GET /v1/billing/status's tenants (?cursor=)
	// when more may follow; null on the last page and in `overage
	// status`, which prints every tenant.
	NextCursor *string `json:"next_cursor"`
}

// statusQuery reads the statement in one query, hence one snapshot. The
// counters come from billing_counters (at most five rows per tenant,
// grouped once); the oldest pending log is the first entry of the partial
// index usage_logs_tenant_pending for that tenant, looked up only when the
// tenant has pending logs. %s is the tenant filter: with "WHERE t.id = $1"
// the planner carries the condition into the grouped subquery, so one
// tenant's statement reads only its own counter rows.
var statusQuery = `
SELECT t.id, t.name, t.stripe_customer_id,
	coalesce(c.usage_logs, 0), coalesce(c.billed, 0), coalesce(c.pending, 0), coalesce(c.not_billable, 0),
	coalesce(c.needs_review, 0), coalesce(c.failed, 0),
	coalesce(c.overage_input_tokens, 0), coalesce(c.overage_output_tokens, 0),
	coalesce(c.billed_input_tokens, 0), coalesce(c.billed_output_tokens, 0),
	CASE WHEN c.pending > 0 THEN
		` + usagelog.OldestPendingSQL("t.id") + `
	END
FROM tenants t
LEFT JOIN (
	SELECT b.tenant_id,
		sum(b.usage_logs)::bigint AS usage_logs,
		(sum(b.usage_logs) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusBilled) + `))::bigint AS billed,
		(sum(b.usage_logs) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusPending) + `))::bigint AS pending,
		(sum(b.usage_logs) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusNotBillable) + `))::bigint AS not_billable,
		(sum(b.usage_logs) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusNeedsReview) + `))::bigint AS needs_review,
		(sum(b.usage_logs) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusFailed) + `))::bigint AS failed,
		sum(b.overage_input_tokens)::bigint AS overage_input_tokens,
		sum(b.overage_output_tokens)::bigint AS overage_output_tokens,
		(sum(b.overage_input_tokens) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusBilled) + `))::bigint AS billed_input_tokens,
		(sum(b.overage_output_tokens) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusBilled) + `))::bigint AS billed_output_tokens
	FROM billing_counters b
	GROUP BY b.tenant_id
) c ON c.tenant_id = t.id
%s
ORDER BY t.name, t.id`

var (
	statusAll       = fmt.Sprintf(statusQuery, "")
	statusOneTenant = fmt.Sprintf(statusQuery, "WHERE t.id = $1")
	// statusPage is a page of tenants: after ($1, $2) in the order, at
	// most $3 of them.
	statusPage = fmt.Sprintf(statusQuery, "WHERE $1::text IS NULL OR (t.name, t.id) > ($1, $2::uuid)") + " LIMIT $3"
)

// totalsQuery is the statement's totals over every tenant, from the same
// counters as the tenants' lines.
var totalsQuery = `
SELECT coalesce(sum(b.usage_logs), 0)::bigint,
	coalesce(sum(b.usage_logs) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusBilled) + `), 0)::bigint,
	coalesce(sum(b.usage_logs) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusPending) + `), 0)::bigint,
	coalesce(sum(b.usage_logs) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusNotBillable) + `), 0)::bigint,
	coalesce(sum(b.usage_logs) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusNeedsReview) + `), 0)::bigint,
	coalesce(sum(b.usage_logs) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusFailed) + `), 0)::bigint,
	coalesce(sum(b.overage_input_tokens), 0)::bigint,
	coalesce(sum(b.overage_output_tokens), 0)::bigint,
	coalesce(sum(b.overage_input_tokens) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusBilled) + `), 0)::bigint,
	coalesce(sum(b.overage_output_tokens) FILTER (WHERE ` + usagelog.Is("b.billing_status", overage.BillingStatusBilled) + `), 0)::bigint,
	` + usagelog.OldestPendingSQL("") + `
FROM billing_counters b`

// statusKey is the cursor of a page of the statement: the last tenant's
// place in the order (name, id).
type statusKey struct {
	Name string    `json:"n"`
	ID   uuid.UUID `json:"i"`
}

// TxBeginner is what StatusPage reads its page and totals in one snapshot
// with; *pgxpool.Pool satisfies it.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// StatusPage is GET /v1/billing/status without ?tenant_id=: one page of
// the tenants, sorted by name then id, and the totals over every tenant
// (the sums of the tenants' lines across all pages), read in one
// snapshot.
func StatusPage(ctx context.Context, db TxBeginner, p page.Params) (*Statement, error) {
	var after *statusKey
	if p.HasCursor() {
		after = &statusKey{}
		if err := p.Cursor(after); err != nil {
			return nil, err
		}
	}
	var r *Statement
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, readSettingsSQL); err != nil {
			return fmt.Errorf("read billing status: %w", err)
		}
		var name *string
		var id *uuid.UUID
		if after != nil {
			name, id = &after.Name, &after.ID
		}
		rows, err := tx.Query(ctx, statusPage, name, id, p.Limit+1)
		if err != nil {
			return fmt.Errorf("read billing status: %w", err)
		}
		if r, err = scanStatement(rows); err != nil {
			return err
		}
		var c Counters
		if err := tx.QueryRow(ctx, totalsQuery).Scan(&c.UsageLogs, &c.Billed, &c.Pending, &c.NotBillable, &c.NeedsReview, &c.Failed,
			&c.OverageInputTokens, &c.OverageOutputTokens, &c.BilledInputTokens, &c.BilledOutputTokens, &c.OldestPendingAt); err != nil {
			return fmt.Errorf("read billing totals: %w", err)
		}
		if c.OldestPendingAt != nil {
			t := c.OldestPendingAt.UTC()
			c.OldestPendingAt = &t
		}
		r.Totals = c
		return addExtraMeters(ctx, tx, r, true)
	})
	if err != nil {
		return nil, dbError(err)
	}
	if len(r.Tenants) > p.Limit {
		r.Tenants = r.Tenants[:p.Limit]
		last := r.Tenants[len(r.Tenants)-1]
		r.NextCursor = page.Next(true, statusKey{Name: last.Name, ID: last.TenantID})
	}
	return r, nil
}

// Status returns the finance statement of every tenant, or of one when
// tenantID is set (then Totals are that tenant's). An unknown tenant is
// overage.ENOTFOUND. A database that cannot be reached is
// overage.EUNAVAILABLE.
func Status(ctx context.Context, db overage.DB, tenantID *uuid.UUID) (*Statement, error) {
	b, ok := db.(TxBeginner)
	if !ok {
		return status(ctx, db, tenantID)
	}
	var r *Statement
	err := pgx.BeginTxFunc(ctx, b, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) (err error) {
		if _, err := tx.Exec(ctx, readSettingsSQL); err != nil {
			return dbError(fmt.Errorf("read billing status: %w", err))
		}
		r, err = status(ctx, tx, tenantID)
		return err
	})
	return r, err
}

// readSettingsSQL opens the transactions of the status reads: statements
// with parameters are planned for each execution (custom plans), and those
// without, whose one plan is cached on the connection, are never planned
// as sequential scans of usage_logs, as they are while the table is small
// (docs/plans.md); JIT goes with the scans (pgplan.NoSeqScan): the totals
// must still scan billing_counters.
const readSettingsSQL = `SELECT set_config('plan_cache_mode', 'force_custom_plan', true), ` + pgplan.NoSeqScan

func status(ctx context.Context, db overage.DB, tenantID *uuid.UUID) (*Statement, error) {
	var rows pgx.Rows
	var err error
	if tenantID == nil {
		rows, err = db.Query(ctx, statusAll)
	} else {
		rows, err = db.Query(ctx, statusOneTenant, *tenantID)
	}
	if err != nil {
		return nil, dbError(fmt.Errorf("read billing status: %w", err))
	}
	r, err := scanStatement(rows)
	if err != nil {
		return nil, dbError(err)
	}
	if tenantID != nil && len(r.Tenants) == 0 {
		return nil, overage.NotFound("tenant %s not found", tenantID)
	}
	// Totals of every tenant are the lines' sums: recomputed from the
	// lines once they have their meters.
	if err := addExtraMeters(ctx, db, r, false); err != nil {
		return nil, dbError(err)
	}
	return r, nil
}

// scanStatement reads the statement's lines, totalling them.
func scanStatement(rows pgx.Rows) (*Statement, error) {
	defer rows.Close()
	r := &Statement{Tenants: []TenantStatus{}}
	for rows.Next() {
		var s TenantStatus
		c := &s.Counters
		if err := rows.Scan(&s.TenantID, &s.Name, &s.StripeCustomerID,
			&c.UsageLogs, &c.Billed, &c.Pending, &c.NotBillable, &c.NeedsReview, &c.Failed,
			&c.OverageInputTokens, &c.OverageOutputTokens, &c.BilledInputTokens, &c.BilledOutputTokens,
			&c.OldestPendingAt); err != nil {
			return nil, fmt.Errorf("read billing status: %w", err)
		}
		if c.OldestPendingAt != nil {
			t := c.OldestPendingAt.UTC()
			c.OldestPendingAt = &t
		}
		r.Tenants = append(r.Tenants, s)
		r.Totals.add(s.Counters)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read billing status: %w", err)
	}
	return r, nil
}

// rebuildSQL is also the backfill of migrations/0002_finance.sql.
var rebuildSQL = `INSERT INTO billing_counters (tenant_id, billing_status, usage_logs, overage_input_tokens, overage_output_tokens)
` + usagelog.CountersSQL

// RebuildCounters recomputes billing_counters from usage_logs in one
// transaction. It first locks usage_logs in SHARE ROW EXCLUSIVE mode, so
// no write can land between the scan and the commit: ingest and the
// workers wait for one sequential scan of usage_logs (seconds per few
// million logs), readers — the finance statement included, which keeps seeing
// the old counters until the commit — do not.
//
// For operators: run it after loading usage_logs with the counter
// triggers disabled (bench/status does), or whenever the counters are in
// doubt; with the triggers enabled it changes nothing.
func RebuildCounters(ctx context.Context, db Beginner) error {
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := usagelog.LockWrites(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM billing_counters`); err != nil {
			return fmt.Errorf("clear billing counters: %w", err)
		}
		if _, err := tx.Exec(ctx, rebuildSQL); err != nil {
			return fmt.Errorf("rebuild billing counters: %w", err)
		}
		return nil
	})
	if err != nil {
		return dbError(fmt.Errorf("rebuild billing counters: %w", err))
	}
	return nil
}
