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

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/tenants"

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

	db1, late, activity, err := billed(ctx, db, usagelog.BilledParams{From: from, End: end, Cutoff: cutoff, TenantIDs: tenantIDs,
		Meters: len(eventOf) > 0}, p.MeterInputEvent, p.MeterOutputEvent, eventOf)
	if err != nil {
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
	ts, err := tenants.ByCustomer(ctx, db, tenantID)
	if err != nil {
		return nil, nil, fmt.Errorf("reconcile: %w", err)
	}
	var customers []Customer
	var ids []uuid.UUID
	for _, tn := range ts {
		if len(customers) == 0 || customers[len(customers)-1].StripeCustomerID != tn.StripeCustomerID {
			customers = append(customers, Customer{StripeCustomerID: tn.StripeCustomerID})
		}
		c := &customers[len(customers)-1]
		c.Tenants = append(c.Tenants, Tenant{ID: tn.ID, Name: tn.Name})
		ids = append(ids, tn.ID)
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

// billed reads the billed overage (usagelog.Billed) by event name: the
// default meters' named inputEvent and outputEvent, the others' by
// eventOf. Meters sharing an event name are added together.
func billed(ctx context.Context, db overage.DB, p usagelog.BilledParams, inputEvent, outputEvent string, eventOf map[string]string) (
	map[rowKey]int64, map[rowKey]int64, map[activityKey]bool, error) {
	s, err := usagelog.Billed(ctx, db, p)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("reconcile: %w", err)
	}
	sums, late := map[rowKey]int64{}, map[rowKey]int64{}
	for k, n := range s.Overage {
		var name string
		switch k.Meter {
		case overage.MeterInput:
			name = inputEvent
		case overage.MeterOutput:
			name = outputEvent
		default:
			var ok bool
			if name, ok = eventOf[k.Meter]; !ok {
				return nil, nil, nil, fmt.Errorf("reconcile: usage logs name the meter %q, which the catalog does not hold", k.Meter)
			}
		}
		sums[rowKey{k.Customer, name, k.Day}] += n
		late[rowKey{k.Customer, name, k.Day}] += s.Late[k]
	}
	activity := map[activityKey]bool{}
	for k := range s.Active {
		activity[activityKey{k.Customer, k.Day}] = true
	}
	return sums, late, activity, nil
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
