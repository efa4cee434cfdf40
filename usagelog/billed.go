package usagelog

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/pgplan"
)

// The overage billed per Stripe customer and meter, computed here once:
// reconciliation compares it with Stripe's daily summaries, the demo's
// closing table and the end-to-end tests (internal/testkit/billingtest)
// with what the Stripe emulator applied.

// BilledParams selects the billed overage Billed sums.
type BilledParams struct {
	// From and End are midnights UTC: the billing days [From, End) are
	// summed. A log's billing day is the UTC day Stripe bills it on: its
	// usage day, or for a log reported late (stripe_timestamp 'reported')
	// the day of its report's timestamp.
	From, End time.Time
	// Cutoff: a (customer, day) with billing activity after it — a log
	// sent, accepted or billed later — is Active.
	Cutoff time.Time
	// TenantIDs limits the sums to these tenants; nil is every tenant.
	TenantIDs []uuid.UUID
	// RequestIDPrefix, when not "", limits them to the logs whose
	// request_id starts with it (one run of the demo).
	RequestIDPrefix string
	// Meters sums the lines of the meters other than the defaults too (a
	// second statement); without it only the default meters are summed.
	Meters bool
}

// BilledKey is one sum of Billed: a Stripe customer, a meter key
// (overage.MeterInput, overage.MeterOutput or another meter's) and a
// billing day (YYYY-MM-DD).
type BilledKey struct {
	Customer, Meter, Day string
}

// CustomerDay is a Stripe customer and a billing day (YYYY-MM-DD).
type CustomerDay struct {
	Customer, Day string
}

// BilledSums is what Billed returns.
type BilledSums struct {
	// Overage is the billed overage per customer, meter and day. Tenants
	// sharing a customer are added together. A key may hold 0 (its logs
	// are not billed, or billed with no overage on the meter).
	Overage map[BilledKey]int64
	// Late is the part of each sum that is earlier days' usage reported
	// late.
	Late map[BilledKey]int64
	// Active holds the (customer, day) pairs with billing activity after
	// the cutoff, of logs in any status but not_billable: each may have
	// touched Stripe.
	Active map[CustomerDay]bool
}

// lateReach bounds how much older than its report a late log's usage
// timestamp can be: ingest takes usage up to overage.MaxEventAge old, and
// its report is formed soon after (a day's margin).
const lateReach = overage.MaxEventAge + 24*time.Hour

// Billed sums the billed overage per (customer, meter, billing day) over
// the days [p.From, p.End) and flags the (customer, day) pairs with
// billing activity after p.Cutoff. Each statement reads the days asked
// through usage_logs_ts, not the whole table (see rangeSettingsSQL); the
// logs below the retention watermark are read from usage_rollups instead.
// On a pool they all run in one read-only snapshot (rangeDB).
func Billed(ctx context.Context, db DB, p BilledParams) (*BilledSums, error) {
	s := &BilledSums{Overage: map[BilledKey]int64{}, Late: map[BilledKey]int64{}, Active: map[CustomerDay]bool{}}
	db, done, err := rangeDB(ctx, db)
	if err != nil {
		return nil, err
	}
	defer done()
	if err := billedOnDefaults(ctx, db, p, s); err != nil {
		return nil, err
	}
	if p.Meters {
		if err := billedOnMeters(ctx, db, p, s); err != nil {
			return nil, err
		}
	}
	if err := billedOnRollups(ctx, db, p, s); err != nil {
		return nil, err
	}
	return s, nil
}

// billedOnRollups adds to s the billed overage of the logs below the
// retention watermark, from usage_rollups (their partitions are dropped,
// or about to be: the log statements skip them). Rollups keep no
// request_id, so a sum limited to a request_id prefix has none; and no
// activity, the logs being long billed. As for the logs, a key comes from
// billed logs only (not_billable ones are never sent).
func billedOnRollups(ctx context.Context, db DB, p BilledParams, s *BilledSums) error {
	if p.RequestIDPrefix != "" {
		return nil
	}
	q := `SELECT t.stripe_customer_id, to_char(r.billing_day, 'YYYY-MM-DD'), r.meter,
			sum(r.billed_tokens)::bigint, sum(r.late_billed_tokens)::bigint
		FROM usage_rollups r JOIN tenants t ON t.id = r.tenant_id
		WHERE r.billing_day >= ($1::timestamptz AT TIME ZONE 'UTC')::date AND r.billing_day < ($2::timestamptz AT TIME ZONE 'UTC')::date
			AND r.billed_logs > 0`
	args := []any{p.From, p.End}
	if !p.Meters {
		q += ` AND r.meter IN ('input', 'output')`
	}
	if p.TenantIDs != nil {
		q += ` AND r.tenant_id = ANY($3)`
		args = append(args, p.TenantIDs)
	}
	rows, err := db.Query(ctx, q+` GROUP BY 1, 2, 3`, args...)
	if err != nil {
		return fmt.Errorf("read billed overage of rollups: %w", err)
	}
	return s.addRows(rows, "rollups")
}

// addRows adds rows of (customer, day, meter, billed, late) to s, what
// naming them in an error.
func (s *BilledSums) addRows(rows pgx.Rows, what string) error {
	defer rows.Close()
	for rows.Next() {
		var k BilledKey
		var n, l int64
		if err := rows.Scan(&k.Customer, &k.Day, &k.Meter, &n, &l); err != nil {
			return fmt.Errorf("read billed overage of %s: %w", what, err)
		}
		s.Overage[k] += n
		s.Late[k] += l
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read billed overage of %s: %w", what, err)
	}
	return nil
}

// CustomerMeter is a Stripe customer and a meter key.
type CustomerMeter struct {
	Customer, Meter string
}

// allDays bound every usage timestamp a log can have; the billing days are
// compared as text, so End must keep four digits of year.
var allDays = struct{ from, end time.Time }{time.Unix(0, 0).UTC(), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)}

// BilledTotals is Billed over every day, of every meter: the overage
// billed per customer and meter, of the tenants given (nil: every tenant)
// and, when requestIDPrefix is not "", of the logs whose request_id starts
// with it. It reads every log of the tenants: for the demo and the tests,
// not for a table of millions.
func BilledTotals(ctx context.Context, db DB, tenantIDs []uuid.UUID, requestIDPrefix string) (map[CustomerMeter]int64, error) {
	s, err := Billed(ctx, db, BilledParams{From: allDays.from, End: allDays.end, Cutoff: allDays.end,
		TenantIDs: tenantIDs, RequestIDPrefix: requestIDPrefix, Meters: true})
	if err != nil {
		return nil, err
	}
	out := map[CustomerMeter]int64{}
	for k, n := range s.Overage {
		out[CustomerMeter{k.Customer, k.Meter}] += n
	}
	return out, nil
}

// billingDaySQL is the UTC day whose summary holds the overage o of line
// (dimension dim, report lead lead) of the usage log u: its usage day, or
// for a log reported at send time (its period was closed when its report
// was formed, stripe_timestamp 'reported') the day of its report's
// timestamp, the one Stripe's event carries.
var billingDaySQL = `to_char(` + billingTimeSQL + ` AT TIME ZONE 'UTC', 'YYYY-MM-DD')`

// billingTimeSQL is the time Stripe bills line (%[1]s lead, %[2]s
// dimension) of the usage log u at: its usage timestamp, or its report's
// for a log reported late. A report whose lead's partition retention
// dropped while a member of it is kept has its timestamp in
// usage_rollup_report_times (RollUpTx).
const billingTimeSQL = `CASE WHEN u.stripe_timestamp = 'reported' THEN coalesce(
		(SELECT r.ts FROM usage_reports r WHERE r.lead_usage_log_id = %[1]s AND r.dimension = %[2]s),
		(SELECT k.ts FROM usage_rollup_report_times k WHERE k.lead_usage_log_id = %[1]s AND k.dimension = %[2]s), u.ts) ELSE u.ts END`

// billedFilter is the optional part of a billed statement's WHERE: the
// tenants and the request_id prefix, numbered from first.
type billedFilter struct {
	tenants, prefix bool
}

func (f billedFilter) where(first int) string {
	q := ""
	if f.tenants {
		q += fmt.Sprintf(` AND u.tenant_id = ANY($%d)`, first)
		first++
	}
	if f.prefix {
		q += fmt.Sprintf(` AND u.request_id LIKE $%d`, first)
	}
	return q
}

func (f billedFilter) args(p BilledParams) []any {
	var args []any
	if f.tenants {
		args = append(args, p.TenantIDs)
	}
	if f.prefix {
		args = append(args, likePrefix(p.RequestIDPrefix))
	}
	return args
}

func filterOf(p BilledParams) billedFilter {
	return billedFilter{tenants: p.TenantIDs != nil, prefix: p.RequestIDPrefix != ""}
}

// likePrefix is a LIKE pattern matching strings that start with p.
func likePrefix(p string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(p) + "%"
}

// billedOnDefaults adds the default meters' sums and the activity to s.
func billedOnDefaults(ctx context.Context, db DB, p BilledParams, s *BilledSums) error {
	// not_billable logs are never sent; every other status may have
	// touched Stripe, so all count towards activity, only billed ones
	// towards the sums. greatest() ignores NULLs.
	f := filterOf(p)
	args := append([]any{p.From, p.End, p.Cutoff, lateReach.Seconds()}, f.args(p)...)
	rows, err := db.Query(ctx, billedQuery(f), args...)
	if err != nil {
		return fmt.Errorf("read billed overage: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k BilledKey
		var n, l int64
		var recent bool
		if err := rows.Scan(&k.Customer, &k.Day, &k.Meter, &n, &l, &recent); err != nil {
			return fmt.Errorf("read billed overage: %w", err)
		}
		s.Overage[k] += n
		s.Late[k] += l
		if recent {
			s.Active[CustomerDay{k.Customer, k.Day}] = true
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read billed overage: %w", err)
	}
	return nil
}

// billedQuery sums billed overage per (customer, day, dimension) over ts
// in [$1 - $4 seconds, $2), with activity after $3, of the tenants $5
// when f.tenants is set (and of the request_id prefix after it). Its
// recent reads the accepted times bare: a NULL that stands for billed_at
// (migration 0073, InputAcceptedAtSQL) adds nothing to a greatest() that
// takes billed_at itself, and the reading would cost every log scanned. The
// range of ts is an index condition of usage_logs_ts (BRIN, migration
// 0050): a run reads the pages of the days asked, not the whole table
// (docs/plans.md).
func billedQuery(f billedFilter) string {
	q := `SELECT cus, day, dim,
			coalesce(sum(o) FILTER (WHERE billed), 0)::bigint,
			coalesce(sum(o) FILTER (WHERE billed AND late), 0)::bigint,
			coalesce(bool_or(recent), false)
		FROM (SELECT t.stripe_customer_id AS cus, d.dim, d.o, ` + fmt.Sprintf(billingDaySQL, "d.lead", "d.dim") + ` AS day,
				` + Is("u.billing_status", overage.BillingStatusBilled) + ` AS billed,
				coalesce(u.stripe_timestamp = 'reported', false) AS late,
				greatest(u.first_attempt_at, u.input_accepted_at, u.output_accepted_at, u.billed_at) > $3 AS recent
			FROM usage_logs u JOIN tenants t ON t.id = u.tenant_id
			CROSS JOIN LATERAL (VALUES ('input', ` + OverageInputSQL("u") + `, u.input_report_lead),
				('output', ` + OverageOutputSQL("u") + `, ` + OutputReportLeadSQL("u") + `)) AS d (dim, o, lead)
			WHERE u.ts >= $1::timestamptz - make_interval(secs => $4) AND u.ts < $2
				AND (u.ts >= $1 OR u.stripe_timestamp = 'reported')
				AND ` + aboveWatermarkSQL("u.id") + `
				AND ` + NotIn("u.billing_status", overage.BillingStatusNotBillable)
	q += f.where(5)
	return q + `) b WHERE day >= to_char($1::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD')
		AND day < to_char($2::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD')
		GROUP BY 1, 2, 3`
}

// billedOnMeters adds to s the billed overage of the meters other than
// the defaults (the usage logs' meter_* arrays), per customer, meter and
// day, as billedOnDefaults does. Activity needs nothing more: a log's
// first_attempt_at and billed_at cover its lines of every meter.
func billedOnMeters(ctx context.Context, db DB, p BilledParams, s *BilledSums) error {
	f := filterOf(p)
	args := append([]any{p.From, p.End, lateReach.Seconds()}, f.args(p)...)
	rows, err := db.Query(ctx, billedOnMetersQuery(f), args...)
	if err != nil {
		return fmt.Errorf("read billed overage of meters: %w", err)
	}
	return s.addRows(rows, "meters")
}

// billedOnMetersQuery sums the billed overage of the other meters per
// (customer, day, meter) over ts in [$1 - $3 seconds, $2), of the tenants
// $4 when f.tenants is set (and of the request_id prefix after it).
func billedOnMetersQuery(f billedFilter) string {
	q := `SELECT cus, day, k, sum(o)::bigint, coalesce(sum(o) FILTER (WHERE late), 0)::bigint
		FROM (SELECT t.stripe_customer_id AS cus, ` + fmt.Sprintf(billingDaySQL, "x.l", "x.k") + ` AS day, x.k, x.o,
				coalesce(u.stripe_timestamp = 'reported', false) AS late
			FROM usage_logs u JOIN tenants t ON t.id = u.tenant_id
			CROSS JOIN LATERAL unnest(u.meter_keys, u.meter_overage, u.meter_leads) AS x (k, o, l)
			WHERE u.ts >= $1::timestamptz - make_interval(secs => $3) AND u.ts < $2
				AND (u.ts >= $1 OR u.stripe_timestamp = 'reported') AND ` + aboveWatermarkSQL("u.id") + `
				AND u.meter_keys IS NOT NULL AND ` + Is("u.billing_status", overage.BillingStatusBilled)
	q += f.where(4)
	return q + `) b WHERE day >= to_char($1::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD')
		AND day < to_char($2::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD')
		GROUP BY 1, 2, 3`
}

// rangeSettingsSQL opens the transaction of each read of a range of ts:
// the range is read through usage_logs_ts (BRIN, 0050) whatever the
// statistics say. The planner costs a BRIN index by the correlation of
// ts with the table's order, which it knows only from ANALYZE: never
// analysed, or analysed while the day asked held every row, it would read
// the whole table instead. Planned for each execution, without JIT
// (pgplan.NoSeqScan).
const rangeSettingsSQL = `SELECT ` + pgplan.NoSeqScan + `, set_config('plan_cache_mode', 'force_custom_plan', true)`

// rangeDB returns a read-only, repeatable-read transaction of db opened
// by rangeSettingsSQL when db can begin one (a pool), else db as it is,
// and what ends it. Billed's statements share it: the logs above the
// watermark and the rollups below it are read in one snapshot, so a
// retention run committing between them cannot count a log twice.
func rangeDB(ctx context.Context, db DB) (DB, func(), error) {
	b, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	})
	if !ok {
		return db, func() {}, nil
	}
	tx, err := b.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, nil, fmt.Errorf("read billed overage: %w", err)
	}
	done := func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }
	if _, err := tx.Exec(ctx, rangeSettingsSQL); err != nil {
		done()
		return nil, nil, fmt.Errorf("read billed overage: %w", err)
	}
	return tx, done, nil
}
