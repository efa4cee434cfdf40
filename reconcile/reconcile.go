package reconcile

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/stripeclient"

	"github.com/overage-billing/overage/usagelog"
)

// Defaults of Params.
const (
	// DefaultSettleAfter is how long a window must have been quiet before it
	// is judged; see docs/reconcile.md.
	DefaultSettleAfter = 2 * time.Hour
	// DefaultConcurrency is how many summary listings run at once. The
	// reader's rate limit bounds the calls per second whatever this is.
	DefaultConcurrency = 4
	// DefaultMeterInputEvent and DefaultMeterOutputEvent are the meter
	// event names of the README's configuration.
	DefaultMeterInputEvent  = overage.DefaultMeterInputEvent
	DefaultMeterOutputEvent = overage.DefaultMeterOutputEvent
)

// DayLayout is how days are written, in flags, rows and results.
const DayLayout = "2006-01-02"

// maxFutureSkew is how far ahead of now a usage timestamp (and so a meter
// event) may be.
const maxFutureSkew = overage.MaxFutureSkew

// Params says what to reconcile.
type Params struct {
	// From and To are the first and the last day, both inclusive, in UTC;
	// any time of day is truncated to its UTC day. Required, From <= To.
	From, To time.Time
	// TenantID, when set, limits the scope to that tenant's Stripe customer
	// (and any other tenant sharing that customer).
	TenantID *uuid.UUID
	// MeterInputEvent and MeterOutputEvent are the meter event names
	// (default DefaultMeterInputEvent, DefaultMeterOutputEvent).
	MeterInputEvent, MeterOutputEvent string
	// Meters are the catalog's meters other than the defaults (archived
	// ones too: usage they took is still billed on them), compared by
	// their event names beside the defaults'.
	Meters []overage.Meter
	// SettleAfter: rows newer than now minus this are too_recent; zero
	// judges every window that has ended, negative is an error. The CLI's
	// default is DefaultSettleAfter.
	SettleAfter time.Duration
	// Now is the time the result is made at (default time.Now()).
	Now time.Time
	// Concurrency is how many Stripe listings run at once (default
	// DefaultConcurrency).
	Concurrency int
}

// Status is the verdict on one row.
type Status string

const (
	StatusMatch      Status = "match"
	StatusDifference Status = "difference"
	StatusTooRecent  Status = "too_recent"
)

// Reasons a row is too_recent.
const (
	ReasonWindowOpen     = "day ends after the settle cutoff"
	ReasonRecentActivity = "billing activity after the settle cutoff"
)

// Row is one (customer, meter, day).
type Row struct {
	Customer string `json:"customer"` // Stripe customer id
	Meter    string `json:"meter"`    // meter event name
	Day      string `json:"day"`      // UTC, YYYY-MM-DD
	Database int64  `json:"database"` // overage billed in PostgreSQL
	Stripe   int64  `json:"stripe"`   // Stripe's aggregated value
	// Delta is Stripe minus Database: negative means billed but not at
	// Stripe, positive means Stripe holds more than was billed.
	Delta  int64  `json:"stripe_minus_database"`
	Status Status `json:"status"`
	// Reason says why a row is too_recent.
	Reason string `json:"reason,omitempty"`
	// ReportedLate is the part of Database that is usage of earlier days
	// whose period was closed when it was reported: Stripe's event carries
	// the time it was reported, so it is billed, and compared, on this day
	// and not on its usage day.
	ReportedLate int64 `json:"reported_late,omitempty"`
}

// Tenant is a tenant in scope.
type Tenant struct {
	ID   uuid.UUID `json:"id"`
	Name string    `json:"name"`
}

// Customer is a Stripe customer in scope and its tenants.
type Customer struct {
	StripeCustomerID string   `json:"stripe_customer_id"`
	Tenants          []Tenant `json:"tenants"`
}

// Meter is one dimension's meter event name and the Stripe meters found
// for it.
type Meter struct {
	Dimension overage.Dimension `json:"dimension"`
	EventName string            `json:"event_name"`
	// MeterIDs are the Stripe meters with this event name; empty when
	// Stripe has none, in which case Stripe holds nothing for it.
	MeterIDs []string `json:"meter_ids"`
}

// Result is the outcome of Run. It marshals to the JSON of
// `overage reconcile --json`.
type Result struct {
	From        string        `json:"from"` // first day, inclusive
	To          string        `json:"to"`   // last day, inclusive
	TenantID    *uuid.UUID    `json:"tenant_id,omitempty"`
	GeneratedAt time.Time     `json:"generated_at"`
	SettleAfter time.Duration `json:"-"`
	// SettleAfterText is SettleAfter as a Go duration string, for JSON.
	SettleAfterText string `json:"settle_after"`
	// SettleCutoff is GeneratedAt minus SettleAfter.
	SettleCutoff time.Time `json:"settle_cutoff"`
	// TooRecentFrom is the first day of the range whose window ends after
	// the cutoff; it and every later day are too recent to judge. Empty
	// when the whole range is settled.
	TooRecentFrom string     `json:"too_recent_from,omitempty"`
	Customers     []Customer `json:"customers"`
	Meters        []Meter    `json:"meters"`
	// Rows lists differences first, then too_recent rows, then matches,
	// each by customer, meter and day.
	Rows        []Row `json:"rows"`
	Matches     int   `json:"matches"`
	Differences int   `json:"differences"`
	TooRecent   int   `json:"too_recent"`
}

// OK reports whether nothing differs. Too-recent rows are not differences.
func (r *Result) OK() bool { return r.Differences == 0 }

// Judged reports whether any window of the range could be compared: a
// row that is not too recent, or settled days on which neither side holds
// anything. A result of today alone is never judged.
func (r *Result) Judged() bool {
	for _, row := range r.Rows {
		if row.Status != StatusTooRecent {
			return true
		}
	}
	return len(r.Rows) == 0 && r.TooRecentFrom != r.From
}

// ParseDay parses a YYYY-MM-DD day (UTC), as the --from and --to flags
// take it.
func ParseDay(s string) (time.Time, error) {
	d, err := time.ParseInLocation(DayLayout, strings.TrimSpace(s), time.UTC)
	if err != nil {
		return time.Time{}, fmt.Errorf("day %q must be YYYY-MM-DD", s)
	}
	return d, nil
}

type rowKey struct {
	customer, meter, day string
}

type activityKey struct {
	customer, day string
}

// Run reconciles the database with Stripe's meter event summaries. db is
// read; stripe is only read. An error means no verdict (a refused Stripe
// call, a meter that does not sum, an unknown tenant); differences are not
// errors — see Result.OK.
func Run(ctx context.Context, db overage.DB, stripe stripeclient.SummaryReader, p Params) (*Result, error) {
	if db == nil || stripe == nil {
		return nil, errors.New("reconcile: a database and a Stripe summary reader are required")
	}
	p, err := p.withDefaults()
	if err != nil {
		return nil, err
	}
	from := utcDay(p.From)
	end := utcDay(p.To).Add(24 * time.Hour) // exclusive
	cutoff := p.Now.Add(-p.SettleAfter)

	res := &Result{
		From: from.Format(DayLayout), To: utcDay(p.To).Format(DayLayout), TenantID: p.TenantID,
		GeneratedAt: p.Now, SettleAfter: p.SettleAfter, SettleAfterText: p.SettleAfter.String(),
		SettleCutoff: cutoff,
	}
	for d := from; d.Before(end); d = d.Add(24 * time.Hour) {
		if d.Add(24 * time.Hour).After(cutoff) {
			res.TooRecentFrom = d.Format(DayLayout)
			break
		}
	}

	customers, tenantIDs, err := scope(ctx, db, p.TenantID)
	if err != nil {
		return nil, err
	}
	res.Customers = customers

	dims := []struct {
		dim  overage.Dimension
		name string
	}{{overage.DimensionInput, p.MeterInputEvent}, {overage.DimensionOutput, p.MeterOutputEvent}}
	// One row per event name: meters sharing a Stripe meter are summed,
	// and Stripe's side is read once.
	names := map[string]bool{p.MeterInputEvent: true, p.MeterOutputEvent: true}
	eventOf := map[string]string{}
	for _, m := range p.Meters {
		if overage.IsDefaultMeter(m.Key) {
			continue
		}
		eventOf[m.Key] = m.EventName
		if !names[m.EventName] {
			names[m.EventName] = true
			dims = append(dims, struct {
				dim  overage.Dimension
				name string
			}{overage.Dimension(m.Key), m.EventName})
		}
	}

	meters, err := stripe.Meters(ctx)
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	for _, d := range dims {
		m := Meter{Dimension: d.dim, EventName: d.name, MeterIDs: []string{}}
		for _, sm := range meters {
			if sm.EventName != d.name {
				continue
			}
			if sm.Formula != "" && sm.Formula != "sum" {
				return nil, fmt.Errorf("reconcile: Stripe meter %s (%s) aggregates with %q, not sum, so its summaries cannot be compared with billed overage",
					sm.ID, sm.EventName, sm.Formula)
			}
			m.MeterIDs = append(m.MeterIDs, sm.ID)
		}
		res.Meters = append(res.Meters, m)
	}

	db1, late, activity, err := billed(ctx, db, from, end, cutoff, tenantIDs, p.MeterInputEvent, p.MeterOutputEvent)
	if err != nil {
		return nil, err
	}
	if err := billedOnMeters(ctx, db, from, end, tenantIDs, eventOf, db1, late); err != nil {
		return nil, err
	}
	st, err := summaries(ctx, stripe, p, from, end, customers, res.Meters)
	if err != nil {
		return nil, err
	}

	keys := map[rowKey]bool{}
	for k, v := range db1 {
		if v != 0 {
			keys[k] = true
		}
	}
	for k, v := range st {
		if v != 0 {
			keys[k] = true
		}
	}
	for k := range keys {
		r := Row{Customer: k.customer, Meter: k.meter, Day: k.day, Database: db1[k], Stripe: st[k], ReportedLate: late[k]}
		r.Delta = r.Stripe - r.Database
		switch {
		case res.TooRecentFrom != "" && k.day >= res.TooRecentFrom:
			r.Status, r.Reason = StatusTooRecent, ReasonWindowOpen
		case activity[activityKey{k.customer, k.day}]:
			r.Status, r.Reason = StatusTooRecent, ReasonRecentActivity
		case r.Delta == 0:
			r.Status = StatusMatch
		default:
			r.Status = StatusDifference
		}
		switch r.Status {
		case StatusMatch:
			res.Matches++
		case StatusDifference:
			res.Differences++
		case StatusTooRecent:
			res.TooRecent++
		}
		res.Rows = append(res.Rows, r)
	}
	order := map[Status]int{StatusDifference: 0, StatusTooRecent: 1, StatusMatch: 2}
	sort.Slice(res.Rows, func(i, j int) bool {
		a, b := res.Rows[i], res.Rows[j]
		if order[a.Status] != order[b.Status] {
			return order[a.Status] < order[b.Status]
		}
		if a.Customer != b.Customer {
			return a.Customer < b.Customer
		}
		if a.Meter != b.Meter {
			return a.Meter < b.Meter
		}
		return a.Day < b.Day
	})
	if res.Rows == nil {
		res.Rows = []Row{}
	}
	return res, nil
}

func (p Params) withDefaults() (Params, error) {
	if p.From.IsZero() || p.To.IsZero() {
		return p, errors.New("reconcile: both the first and the last day are required")
	}
	if utcDay(p.From).After(utcDay(p.To)) {
		return p, fmt.Errorf("reconcile: the first day %s is after the last day %s",
			utcDay(p.From).Format(DayLayout), utcDay(p.To).Format(DayLayout))
	}
	if p.SettleAfter < 0 {
		return p, fmt.Errorf("reconcile: settle-after %s must not be negative", p.SettleAfter)
	}
	if p.MeterInputEvent == "" {
		p.MeterInputEvent = DefaultMeterInputEvent
	}
	if p.MeterOutputEvent == "" {
		p.MeterOutputEvent = DefaultMeterOutputEvent
	}
	if p.MeterInputEvent == p.MeterOutputEvent {
		return p, fmt.Errorf("reconcile: the input and output meters are both %q", p.MeterInputEvent)
	}
	if p.Now.IsZero() {
		p.Now = time.Now()
	}
	p.Now = p.Now.UTC()
	if p.Concurrency <= 0 {
		p.Concurrency = DefaultConcurrency
	}
	return p, nil
}

// utcDay is the midnight UTC starting t's UTC day. (Truncate works on
// absolute time, whose zero is a midnight UTC.)
func utcDay(t time.Time) time.Time { return t.UTC().Truncate(24 * time.Hour) }

// scope returns the customers in scope and, with a tenant filter, the ids
// of their tenants (nil without a filter: every tenant).
func scope(ctx context.Context, db overage.DB, tenantID *uuid.UUID) ([]Customer, []uuid.UUID, error) {
	q := `SELECT id, name, stripe_customer_id FROM tenants ORDER BY stripe_customer_id, id`
	var args []any
	if tenantID != nil {
		q = `SELECT id, name, stripe_customer_id FROM tenants
			WHERE stripe_customer_id = (SELECT stripe_customer_id FROM tenants WHERE id = $1)
			ORDER BY stripe_customer_id, id`
		args = append(args, *tenantID)
	}
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("reconcile: reading tenants: %w", err)
	}
	defer rows.Close()
	var customers []Customer
	var ids []uuid.UUID
	for rows.Next() {
		var t Tenant
		var cus string
		if err := rows.Scan(&t.ID, &t.Name, &cus); err != nil {
			return nil, nil, fmt.Errorf("reconcile: reading tenants: %w", err)
		}
		if len(customers) == 0 || customers[len(customers)-1].StripeCustomerID != cus {
			customers = append(customers, Customer{StripeCustomerID: cus})
		}
		c := &customers[len(customers)-1]
		c.Tenants = append(c.Tenants, t)
		ids = append(ids, t.ID)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("reconcile: reading tenants: %w", err)
	}
	if tenantID != nil {
		if len(customers) == 0 {
			return nil, nil, fmt.Errorf("reconcile: %w", overage.NotFound("tenant %s not found", *tenantID))
		}
		return customers, ids, nil
	}
	if customers == nil {
		customers = []Customer{}
	}
	return customers, nil, nil
}

// lateReach bounds how much older than its report a late log's usage
// timestamp can be: ingest takes usage up to overage.MaxEventAge old, and
// its report is formed soon after (a day's margin).
const lateReach = overage.MaxEventAge + 24*time.Hour

// billingDaySQL is the UTC day whose summary holds the overage o of line
// (dimension dim, report lead lead) of the usage log u: its usage day, or
// for a log reported at send time (its period was closed when its report
// was formed, stripe_timestamp 'reported') the day of its report's
// timestamp, the one Stripe's event carries.
const billingDaySQL = `to_char(CASE WHEN u.stripe_timestamp = 'reported' THEN coalesce(
		(SELECT r.ts FROM usage_reports r WHERE r.lead_usage_log_id = %[1]s AND r.dimension = %[2]s), u.ts) ELSE u.ts END
	AT TIME ZONE 'UTC', 'YYYY-MM-DD')`

// billed sums billed overage per (customer, meter, day) over [from, end),
// and flags the (customer, day) pairs with billing activity after cutoff.
// A day is the one Stripe bills the usage on (billingDaySQL); late holds
// the part of each sum that is earlier days' usage reported late.
func billed(ctx context.Context, db overage.DB, from, end, cutoff time.Time, tenantIDs []uuid.UUID, inputEvent, outputEvent string) (map[rowKey]int64, map[rowKey]int64, map[activityKey]bool, error) {
	// not_billable logs are never sent; every other status may have
	// touched Stripe, so all count towards activity, only billed ones
	// towards the sums. greatest() ignores NULLs.
	q := billedQuery(tenantIDs != nil)
	args := []any{from, end, cutoff, lateReach.Seconds()}
	if tenantIDs != nil {
		args = append(args, tenantIDs)
	}
	db, done, err := rangeDB(ctx, db)
	if err != nil {
		return nil, nil, nil, err
	}
	defer done()
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("reconcile: reading billed overage: %w", err)
	}
	defer rows.Close()
	sums, late := map[rowKey]int64{}, map[rowKey]int64{}
	activity := map[activityKey]bool{}
	for rows.Next() {
		var cus, day, dim string
		var n, l int64
		var recent bool
		if err := rows.Scan(&cus, &day, &dim, &n, &l, &recent); err != nil {
			return nil, nil, nil, fmt.Errorf("reconcile: reading billed overage: %w", err)
		}
		name := inputEvent
		if dim == string(overage.DimensionOutput) {
			name = outputEvent
		}
		// Several tenants may share a customer: add, never overwrite.
		sums[rowKey{cus, name, day}] += n
		late[rowKey{cus, name, day}] += l
		if recent {
			activity[activityKey{cus, day}] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, fmt.Errorf("reconcile: reading billed overage: %w", err)
	}
	return sums, late, activity, nil
}

// billedQuery sums billed overage per (customer, day, dimension) over ts
// in [$1 - $4 seconds, $2), with activity after $3, of the tenants $5 when
// tenants is set. The range of ts is an index condition of usage_logs_ts
// (BRIN, migration 0050): a run reads the pages of the days asked, not the
// whole table (docs/plans.md).
func billedQuery(tenants bool) string {
	q := `SELECT cus, day, dim,
			coalesce(sum(o) FILTER (WHERE billed), 0)::bigint,
			coalesce(sum(o) FILTER (WHERE billed AND late), 0)::bigint,
			coalesce(bool_or(recent), false)
		FROM (SELECT t.stripe_customer_id AS cus, d.dim, d.o, ` + fmt.Sprintf(billingDaySQL, "d.lead", "d.dim") + ` AS day,
				` + usagelog.Is("u.billing_status", overage.BillingStatusBilled) + ` AS billed,
				coalesce(u.stripe_timestamp = 'reported', false) AS late,
				greatest(u.first_attempt_at, u.input_accepted_at, u.output_accepted_at, u.billed_at) > $3 AS recent
			FROM usage_logs u JOIN tenants t ON t.id = u.tenant_id
			CROSS JOIN LATERAL (VALUES ('input', u.overage_input_tokens, u.input_report_lead),
				('output', u.overage_output_tokens, u.output_report_lead)) AS d (dim, o, lead)
			WHERE u.ts >= $1::timestamptz - make_interval(secs => $4) AND u.ts < $2
				AND (u.ts >= $1 OR u.stripe_timestamp = 'reported')
				AND ` + usagelog.NotIn("u.billing_status", overage.BillingStatusNotBillable)
	if tenants {
		q += ` AND u.tenant_id = ANY($5)`
	}
	return q + `) b WHERE day >= to_char($1::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD')
		AND day < to_char($2::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD')
		GROUP BY 1, 2, 3`
}

// billedOnMeters adds to sums (and late) the billed overage of the meters
// other than the defaults (the usage logs' meter_* arrays), per customer,
// event name and day, as billed does. Activity needs nothing more: a log's
// first_attempt_at and billed_at cover its lines of every meter.
func billedOnMeters(ctx context.Context, db overage.DB, from, end time.Time, tenantIDs []uuid.UUID, eventOf map[string]string,
	sums, late map[rowKey]int64) error {
	if len(eventOf) == 0 {
		return nil
	}
	q := billedOnMetersQuery(tenantIDs != nil)
	args := []any{from, end, lateReach.Seconds()}
	if tenantIDs != nil {
		args = append(args, tenantIDs)
	}
	db, done, err := rangeDB(ctx, db)
	if err != nil {
		return err
	}
	defer done()
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("reconcile: reading billed overage of meters: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var cus, day, key string
		var n, l int64
		if err := rows.Scan(&cus, &day, &key, &n, &l); err != nil {
			return fmt.Errorf("reconcile: reading billed overage of meters: %w", err)
		}
		name, ok := eventOf[key]
		if !ok {
			return fmt.Errorf("reconcile: usage logs name the meter %q, which the catalog does not hold", key)
		}
		sums[rowKey{cus, name, day}] += n
		late[rowKey{cus, name, day}] += l
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reconcile: reading billed overage of meters: %w", err)
	}
	return nil
}

// billedOnMetersQuery sums the billed overage of the other meters per
// (customer, day, meter) over ts in [$1 - $3 seconds, $2), of the tenants
// $4 when tenants is set.
func billedOnMetersQuery(tenants bool) string {
	q := `SELECT cus, day, k, sum(o)::bigint, coalesce(sum(o) FILTER (WHERE late), 0)::bigint
		FROM (SELECT t.stripe_customer_id AS cus, ` + fmt.Sprintf(billingDaySQL, "x.l", "x.k") + ` AS day, x.k, x.o,
				coalesce(u.stripe_timestamp = 'reported', false) AS late
			FROM usage_logs u JOIN tenants t ON t.id = u.tenant_id
			CROSS JOIN LATERAL unnest(u.meter_keys, u.meter_overage, u.meter_leads) AS x (k, o, l)
			WHERE u.ts >= $1::timestamptz - make_interval(secs => $3) AND u.ts < $2
				AND (u.ts >= $1 OR u.stripe_timestamp = 'reported')
				AND u.meter_keys IS NOT NULL AND ` + usagelog.Is("u.billing_status", overage.BillingStatusBilled)
	if tenants {
		q += ` AND u.tenant_id = ANY($4)`
	}
	return q + `) b WHERE day >= to_char($1::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD')
		AND day < to_char($2::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD')
		GROUP BY 1, 2, 3`
}

// rangeSettingsSQL opens the transaction of each read of a range of ts:
// the range is read through usage_logs_ts (BRIN, 0050) whatever the
// statistics say. The planner costs a BRIN index by the correlation of
// ts with the table's order, which it knows only from ANALYZE: never
// analysed, or analysed while the day asked held every row, it would read
// the whole table instead. Planned for each execution, without JIT (a
// plan that must keep a disabled scan is costed far above jit_above_cost).
const rangeSettingsSQL = `SELECT set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_custom_plan', true),
	set_config('jit', 'off', true)`

// rangeDB returns a read-only transaction of db opened by rangeSettingsSQL
// when db can begin one (a pool), else db as it is, and what ends it.
func rangeDB(ctx context.Context, db overage.DB) (overage.DB, func(), error) {
	b, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	})
	if !ok {
		return db, func() {}, nil
	}
	tx, err := b.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, nil, fmt.Errorf("reconcile: %w", err)
	}
	done := func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }
	if _, err := tx.Exec(ctx, rangeSettingsSQL); err != nil {
		done()
		return nil, nil, fmt.Errorf("reconcile: %w", err)
	}
	return tx, done, nil
}

// summaries reads Stripe's daily summaries for every customer and meter.
// The range is cut at the day after now plus the allowed clock skew: no
// event can carry a later timestamp.
func summaries(ctx context.Context, sr stripeclient.SummaryReader, p Params, from, end time.Time,
	customers []Customer, meters []Meter) (map[rowKey]int64, error) {
	end = minTime(end, utcDay(p.Now.Add(maxFutureSkew)).Add(24*time.Hour))
	out := map[rowKey]int64{}
	if !from.Before(end) {
		return out, nil
	}

	type job struct{ customer, eventName, meterID string }
	var jobs []job
	for _, c := range customers {
		for _, m := range meters {
			for _, id := range m.MeterIDs {
				jobs = append(jobs, job{c.StripeCustomerID, m.EventName, id})
			}
		}
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel(err)
	}
	work := make(chan job)
	for range min(p.Concurrency, max(len(jobs), 1)) {
		wg.Go(func() {
			for j := range work {
				if ctx.Err() != nil {
					continue
				}
				ss, err := sr.DailySummaries(ctx, j.meterID, j.customer, from, end)
				if err != nil {
					fail(fmt.Errorf("reconcile: %w", err))
					continue
				}
				local := map[rowKey]int64{}
				for _, s := range ss {
					if s.End.Sub(s.Start) != 24*time.Hour || !s.Start.Equal(utcDay(s.Start)) ||
						s.Start.Before(from) || s.End.After(end) {
						fail(fmt.Errorf("reconcile: Stripe returned a summary of meter %s for %s over [%s, %s), not one UTC day within [%s, %s)",
							j.meterID, j.customer, s.Start.Format(time.RFC3339), s.End.Format(time.RFC3339),
							from.Format(time.RFC3339), end.Format(time.RFC3339)))
						break
					}
					v, ok := integral(s.Value)
					if !ok {
						fail(fmt.Errorf("reconcile: Stripe's summary of meter %s for %s on %s is %v, not a whole number",
							j.meterID, j.customer, s.Start.Format(DayLayout), s.Value))
						break
					}
					local[rowKey{j.customer, j.eventName, s.Start.Format(DayLayout)}] += v
				}
				mu.Lock()
				for k, v := range local {
					out[k] += v
				}
				mu.Unlock()
			}
		})
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("reconcile: %w", context.Cause(ctx))
	}
	return out, nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// integral returns v as an integer and whether it was one: a sum of integer
// meter values always is.
func integral(v float64) (int64, bool) {
	if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > 1<<53 {
		return 0, false
	}
	r := math.Round(v)
	return int64(r), r == v
}

// TooRecentWindows lists the too_recent rows' (customer, day) windows that
// are too recent because of billing activity rather than the day's end, in
// row order, without repeats.
func (r *Result) TooRecentWindows() []string {
	var out []string
	for _, row := range r.Rows {
		if row.Status == StatusTooRecent && row.Reason == ReasonRecentActivity {
			w := row.Customer + " " + row.Day
			if !slices.Contains(out, w) {
				out = append(out, w)
			}
		}
	}
	return out
}
