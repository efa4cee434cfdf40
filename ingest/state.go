package ingest

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/alerts"
	"github.com/overage-billing/overage/usagelog"
)

// The state of an ingest transaction (step 3 of txn.go): what it read
// before deciding, and the rows it adds.

// state is what an ingest transaction read before deciding.
type state struct {
	claim   *claim                       // the members' keys (txn.go)
	earlier map[string]*overage.UsageLog // by request_id
	// The tenant's allowance, the transaction's now() (created_at of its
	// logs), each event's allowance period, and each period's total.
	allowance overage.Overage
	now       time.Time
	periods   []time.Time
	totals    map[time.Time]*overage.Overage
	// ordered holds the periods whose allowance was not used up: this
	// transaction holds their lock and writes their slot 0.
	ordered map[time.Time]bool
	// slot is the transaction's leased slot for every other row it adds to.
	slot int16
	// The meters other than the defaults: their allowances, and their
	// period totals when the catalog had such meters (extraRead).
	included  map[string]int64
	extra     extraTotals
	extraRead bool
	// catalog is the meter catalog of the version the transaction read.
	catalog        *overage.Catalog
	catalogVersion int64
	routes         map[string]overage.Routing
	lineBlock      []overage.MeterLine   // see newLines
	meterTokens    []overage.MeterTokens // the routed amounts of one event, reused event after event (split keeps none)
	// closed holds the periods closed when the transaction read them
	// (usagelog.PeriodClosedSQL): their new logs answer "reported".
	closed map[time.Time]bool
}

// newState is the state of a transaction holding slot, routing with cat.
func newState(slot int16, cat *overage.Catalog) *state {
	return &state{slot: slot, earlier: map[string]*overage.UsageLog{}, totals: map[time.Time]*overage.Overage{},
		ordered: map[time.Time]bool{}, extra: extraTotals{}, catalog: cat, closed: map[time.Time]bool{}}
}

// readState is steps 1 and 3's reads for new events: it claims the
// members' keys and reads, in one round trip and in snapshots taken after
// the locks, the stored records, the logs already recorded under the
// request_ids, the allowance and the period totals. The period of a usage
// timestamp is the tenant's Stripe subscription period covering it when
// the webhooks told us one (tenant_subscriptions), else its calendar month
// in UTC.
func readState(ctx context.Context, tx *pipeTx, g *group, slot int16, cat *overage.Catalog, grace time.Duration) (*state, error) {
	st := newState(slot, cat)
	var rids pgArray[pgString]
	ts := make(pgArray[pgTimestamptz], len(g.events))
	for i, ev := range g.events {
		if ev.RequestID != nil {
			rids = append(rids, pgString(*ev.RequestID))
		}
		ts[i] = pgTimestamptz(ev.Timestamp)
	}
	keys := make([]string, len(g.members))
	for i, m := range g.members {
		keys[i] = m.key
	}
	b := &pgx.Batch{}
	// Generic plans, for single events, groups and batches alike: they
	// cost PostgreSQL less CPU an event than custom ones for single events
	// and groups, and for a batch of 100 the key lookup alone was planned
	// anew at every execution (1.2 ms, against 0.1 ms to run it): 16% less
	// CPU an event with generic plans, the same for batches of 1,000
	// (docs/benchmarks.md, "Measurements behind the code"). The settings
	// keep every lookup on the whole key whatever the plan.
	queueClaim(b, g.tenantID, keys, slot, "force_generic_plan")
	if len(rids) > 0 {
		b.Queue(logsByRequestIDSQL, pgUUID(g.tenantID), rids)
	}
	b.Queue(periodsSQL, pgUUID(g.tenantID), ts, grace.Seconds())
	if cat.Extra() {
		months, lo, hi := eventMonths(g.events)
		b.Queue(extraTotalsSQL, pgUUID(g.tenantID), months, lo, hi)
		st.extraRead = true
	}
	br := tx.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	var err error
	if st.claim, err = scanClaim(br, len(g.members)); err != nil {
		return nil, err
	}
	if len(rids) > 0 {
		if err := st.scanEarlier(br.Query()); err != nil {
			return nil, err
		}
	}
	st.periods = make([]time.Time, len(g.events))
	if n, err := st.scanPeriods(br.Query()); err != nil {
		return nil, err
	} else if n != len(g.events) {
		return nil, fmt.Errorf("read allowance periods: %d periods for %d events", n, len(g.events))
	}
	if st.extraRead {
		if err := st.scanExtraTotals(br.Query()); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// scanEarlier reads the rows of logsByRequestIDSQL into st.earlier.
func (st *state) scanEarlier(rows pgx.Rows, err error) error {
	if err != nil {
		return fmt.Errorf("read usage logs by request_id: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		l, err := scanLog(rows)
		if err != nil {
			return fmt.Errorf("read usage logs by request_id: %w", err)
		}
		st.earlier[*l.RequestID] = l
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read usage logs by request_id: %w", err)
	}
	return nil
}

// scanPeriods reads the rows of periodsSQL, a row a period: its events'
// periods into st.periods (made as long as the events), each period's
// total and whether it is closed, the tenant's allowances, the catalog
// version and now(). n is how many events it gave a period.
func (st *state) scanPeriods(rows pgx.Rows, err error) (n int, _ error) {
	if err != nil {
		return 0, fmt.Errorf("read allowance periods: %w", err)
	}
	defer rows.Close()
	var start time.Time
	var tot overage.Overage
	var version *int64
	var included map[string]int64
	var closed bool
	var events []int32
	for rows.Next() {
		if err := rows.Scan(&start, &tot.InputTokens, &tot.OutputTokens,
			&st.allowance.InputTokens, &st.allowance.OutputTokens, &st.now, &included, &version, &closed, &events); err != nil {
			return 0, fmt.Errorf("read allowance periods: %w", err)
		}
		start, st.now = start.UTC(), st.now.UTC()
		if version != nil {
			st.catalogVersion, st.included = *version, included
		}
		for _, e := range events {
			if e < 1 || int(e) > len(st.periods) || !st.periods[e-1].IsZero() {
				return 0, fmt.Errorf("read allowance periods: event %d of %d given twice or out of range", e, len(st.periods))
			}
			st.periods[e-1] = start
		}
		n += len(events)
		if closed {
			st.closed[start] = true
		}
		t := tot
		st.totals[start] = &t
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("read allowance periods: %w", err)
	}
	return n, nil
}

// scanExtraTotals reads the rows of extraTotalsSQL (or the re-read after
// the period lock) into st.extra, replacing the periods it names.
func (st *state) scanExtraTotals(rows pgx.Rows, err error) error {
	if err != nil {
		return fmt.Errorf("read meter totals: %w", err)
	}
	defer rows.Close()
	var start time.Time
	var meter string
	var n int64
	for rows.Next() {
		if err := rows.Scan(&start, &meter, &n); err != nil {
			return fmt.Errorf("read meter totals: %w", err)
		}
		st.extra.add(start.UTC(), meter, n)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read meter totals: %w", err)
	}
	return nil
}

// order makes the totals exact where the split needs them. A period whose
// committed total had reached the allowance in both dimensions needs
// nothing: totals only grow, so each new event's overage is all its
// tokens whatever the order. Any other period of the new events is locked
// (sorted, so two batches never wait for each other in a cycle) and its
// total read again in a statement that starts after the lock is granted:
// every event that charged it before committed, and one that did not take
// the lock only ran because the total it saw — which this read sees too —
// was already at the allowance.
func (st *state) order(ctx context.Context, tx pgx.Tx, g *group, fresh []int) error {
	fed := st.fedMeters(g, fresh)
	var open []time.Time
	for _, i := range fresh {
		p := st.periods[i]
		if st.ordered[p] || !st.needsOrder(p, fed[p], fed == nil) {
			continue
		}
		st.ordered[p] = true
		open = append(open, p)
	}
	var extras []string
	if st.catalog.Extra() {
		extras = []string{} // every meter's
	}
	return st.lockPeriods(ctx, tx, g.tenantID, open, periodLocks{meters: extras})
}

// periodLocks are the options of lockPeriods.
type periodLocks struct {
	// meters are the meters other than the defaults whose totals are read
	// again (nil: none; empty: every meter's).
	meters []string
	// rows locks the periods' total rows too (FOR UPDATE), so the reads
	// wait for every writer of them still in flight: what a delta log,
	// whose tokens may lower a total, needs to be exact against unordered
	// transactions.
	rows bool
	// tenant reads the tenant's allowances and now() after the locks.
	tenant bool
}

// lockPeriods takes the periods' advisory locks, sorted (so two
// transactions never wait for each other in a cycle), marks them ordered
// (their writes go to slot 0) and reads their totals again in statements
// that start after the locks are granted.
func (st *state) lockPeriods(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, periods []time.Time, o periodLocks) error {
	if len(periods) == 0 {
		return nil
	}
	type lock struct{ a, b int32 }
	locks := make([]lock, len(periods))
	for i, p := range periods {
		st.ordered[p] = true
		if st.totals[p] == nil {
			st.totals[p] = &overage.Overage{}
		}
		a, b := periodLockKey(tenantID, p)
		locks[i] = lock{a, b}
	}
	slices.SortFunc(locks, func(x, y lock) int {
		if c := cmp.Compare(x.a, y.a); c != 0 {
			return c
		}
		return cmp.Compare(x.b, y.b)
	})
	b := &pgx.Batch{}
	for _, l := range locks {
		b.Queue(`SELECT pg_advisory_xact_lock($1::int4, $2::int4)`, l.a, l.b)
	}
	queuePeriodTotals(b, tenantID, periods, o)
	if o.tenant {
		b.Queue(tenantAllowanceSQL, pgUUID(tenantID))
	}
	br := tx.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	for range locks {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("lock allowance period: %w", err)
		}
	}
	if err := st.scanTotals(br.Query()); err != nil {
		return err
	}
	if o.meters != nil {
		for _, p := range periods {
			delete(st.extra, p)
		}
		if err := st.scanExtraTotals(br.Query()); err != nil {
			return err
		}
	}
	if o.tenant {
		var now time.Time
		if err := br.QueryRow().Scan(&st.allowance.InputTokens, &st.allowance.OutputTokens, &st.included, &now); err != nil {
			return fmt.Errorf("read allowance: %w", err)
		}
		st.now = now.UTC()
	}
	return nil
}

// scanTotals reads the rows of the allowance totals' re-read into
// st.totals.
func (st *state) scanTotals(rows pgx.Rows, err error) error {
	if err != nil {
		return fmt.Errorf("read allowance totals: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var start time.Time
		var tot overage.Overage
		if err := rows.Scan(&start, &tot.InputTokens, &tot.OutputTokens); err != nil {
			return fmt.Errorf("read allowance totals: %w", err)
		}
		*st.totals[start.UTC()] = tot
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read allowance totals: %w", err)
	}
	return nil
}

// route is the routing of model's tokens, computed once per model.
func (st *state) route(model string) overage.Routing {
	if st.routes == nil {
		st.routes = map[string]overage.Routing{}
	}
	r, ok := st.routes[model]
	if !ok {
		r = st.catalog.Route(model)
		st.routes[model] = r
	}
	return r
}

// writes are the rows an ingest transaction adds.
type writes struct {
	logs      []*overage.UsageLog
	periods   []time.Time
	reportIDs []uuid.UUID
	// Token deltas of the default meters per period, in first-seen order,
	// and of the other meters per period and meter.
	deltaOrder []time.Time
	deltas     map[time.Time]*overage.Overage
	extra      []meterDelta
	extraIndex map[meterDelta]int // in extra, by (period, meter)
	lastExtra  []int              // the previous log's lines' indexes in extra
	spareExtra []int              // the buffer lastExtra alternates with
	// lines of the logs, in their order.
	lines [][]overage.MeterLine
	// streamRIDs are the logs' stream_request_id (nil: none has one).
	streamRIDs []*string
	// after, when set, queues the caller's own statements after the
	// logs', before the stored answers (a checkpoint's stream advance).
	after func(b *pgx.Batch)
}

func newWrites(n int) *writes {
	return &writes{deltas: map[time.Time]*overage.Overage{}, extraIndex: map[meterDelta]int{},
		logs: make([]*overage.UsageLog, 0, n), periods: make([]time.Time, 0, n), lines: make([][]overage.MeterLine, 0, n)}
}

// meterDelta is tokens added to one non-default meter's period total.
type meterDelta struct {
	period time.Time
	meter  string
	tokens int64
}

// add adds a log of period p with its split lines (state.split): its
// report when billable, its tokens to the period's deltas.
func (w *writes) add(l *overage.UsageLog, p time.Time, lines []overage.MeterLine) {
	if l.BillingStatus == overage.BillingStatusPending {
		w.reportIDs = append(w.reportIDs, l.ID)
	}
	w.logs = append(w.logs, l)
	w.periods = append(w.periods, p)
	w.lines = append(w.lines, lines)
	d, ok := w.deltas[p]
	if !ok {
		d = &overage.Overage{}
		w.deltas[p] = d
		w.deltaOrder = append(w.deltaOrder, p)
	}
	d.InputTokens += lines[0].Tokens
	d.OutputTokens += lines[1].Tokens
	// Consecutive logs of one model and period feed the same meters in the
	// same order: the previous log's k-th line's delta is tried before
	// the index (hashing a period and a key, three times a log).
	last := w.lastExtra
	w.lastExtra = w.spareExtra[:0]
	for k, ln := range lines[2:] {
		j := -1
		if k < len(last) {
			if d := &w.extra[last[k]]; d.meter == ln.Meter && d.period.Equal(p) {
				j = last[k]
			}
		}
		if j < 0 {
			key := meterDelta{period: p, meter: ln.Meter}
			var ok bool
			if j, ok = w.extraIndex[key]; !ok {
				j = len(w.extra)
				w.extraIndex[key] = j
				w.extra = append(w.extra, key)
			}
		}
		w.extra[j].tokens += ln.Tokens
		w.lastExtra = append(w.lastExtra, j)
	}
	w.spareExtra = last
}

// finish sets what the split lines decide of a log: its billing status,
// its lines as its row holds them (a copy: lines stay as split), presented
// with the catalog.
func (st *state) finish(l *overage.UsageLog, lines []overage.MeterLine) {
	setStatus(l, lines)
	l.Meters = rawLinesInto(st.newLines(len(lines)), l, lines)
	st.catalog.Present(l)
}

// setStatus is a new log's billing status: pending when a line has
// overage to send.
func setStatus(l *overage.UsageLog, lines []overage.MeterLine) {
	l.BillingStatus = overage.BillingStatusNotBillable
	if billable(lines) {
		l.BillingStatus = overage.BillingStatusPending
	}
}

// newLogs computes, in arrival order, each new event's overage from its
// period's running total (state.split) and the log that records it.
func (st *state) newLogs(g *group, fresh []int, results []result) (*writes, error) {
	w := newWrites(len(fresh))
	// The random bits of every id in one read of crypto/rand rather than
	// one each (half of this function's time), and one allocation for the
	// logs of a batch, not one each.
	random := make([]byte, 16*len(fresh))
	if _, err := rand.Read(random); err != nil {
		return nil, fmt.Errorf("usage log ids: %w", err)
	}
	randomIDs := bytes.NewReader(random)
	logs := make([]overage.UsageLog, len(fresh))
	for k, i := range fresh {
		ev := g.events[i]
		p := st.periods[i]
		id, err := uuid.NewV7FromReader(randomIDs)
		if err != nil {
			return nil, fmt.Errorf("usage log id: %w", err)
		}
		st.meterTokens = st.route(ev.ModelID).AppendLines(st.meterTokens[:0], overage.Amounts(ev.InputTokens, ev.OutputTokens, ev.Parts))
		lines, err := st.split(p, st.meterTokens)
		if err != nil {
			return nil, err
		}
		l := &logs[k]
		*l = overage.UsageLog{
			ID: id, TenantID: g.tenantID, RequestID: ev.RequestID, Timestamp: ev.Timestamp,
			UserID: ev.UserID, ModelID: ev.ModelID, InputTokens: ev.InputTokens, OutputTokens: ev.OutputTokens,
			TokenParts:      ev.Parts,
			CreatedAt:       st.now,
			Kind:            overage.KindUsage,
			StripeTimestamp: usagelog.TimestampUsage,
		}
		if st.closed[p] {
			l.StripeTimestamp = usagelog.TimestampReported
		}
		// The split lines become the log's own lines, not a copy (with
		// three meters a copy was a fifth of this loop's allocation and a
		// tenth of its time): w takes what it needs first, and keeps only
		// what presenting them leaves alone — every line's overage and the
		// other meters' tokens.
		setStatus(l, lines)
		w.add(l, p, lines)
		l.Meters = rawLinesInto(lines[:0], l, lines)
		st.catalog.Present(l)
		results[i] = result{log: l}
	}
	return w, nil
}

// meterUsage is how the new logs change each meter's period total (the
// running totals newLogs left in st). The totals are exact for every
// period with allowance left on a meter it feeds (st.order read them under
// the period's lock); a period past the allowance of every meter it feeds
// crosses no threshold (thresholds are at most 100%).
func (w *writes) meterUsage(st *state) []alerts.Usage {
	out := make([]alerts.Usage, 0, 2*len(w.deltaOrder)+len(w.extra))
	for _, p := range w.deltaOrder {
		after, d := st.totals[p], w.deltas[p]
		out = append(out,
			alerts.Usage{Meter: overage.MeterInput, PeriodStart: p, Included: st.allowance.InputTokens, Before: after.InputTokens - d.InputTokens, After: after.InputTokens},
			alerts.Usage{Meter: overage.MeterOutput, PeriodStart: p, Included: st.allowance.OutputTokens, Before: after.OutputTokens - d.OutputTokens, After: after.OutputTokens})
	}
	for _, d := range w.extra {
		after := st.extra[d.period][d.meter]
		out = append(out, alerts.Usage{Meter: d.meter, PeriodStart: d.period, Included: st.included[d.meter], Before: after - d.tokens, After: after})
	}
	return out
}

// errTotalOverflow answers events that would take their period's total
// past what a bigint holds: nothing is recorded.
var errTotalOverflow = overage.Invalid([]overage.FieldError{
	{Field: "input_tokens", Detail: "would take its billing period's total past 9223372036854775807 tokens"},
	{Field: "output_tokens", Detail: "would take its billing period's total past 9223372036854775807 tokens"},
}, "the tokens would overflow their billing period's total; nothing was recorded")
