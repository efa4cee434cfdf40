package ingest

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/usagelog"
)

// The SQL of the period totals: allowance_usage (the default meters) and
// meter_usage (the others), spread over slot rows summed on read
// (slots.go). Ingest owns both tables; every ingest transaction reads and
// writes them here (the alerts and the finance view only read them).

// closedStartSQL: the period d.start of the tenant $1 is closed, $3 being
// PERIOD_CLOSE_GRACE in seconds (usagelog.PeriodClosedSQL).
var closedStartSQL = usagelog.PeriodClosedSQL("$1", "d.start", "$3")

// periodsSQL reads the period of each event of the tenant $1 ($2 their
// timestamps), each period's totals and whether it is closed, the
// tenant's allowances, the catalog version and now(). It answers a row a
// period, with the events in it by their 1-based positions in $2, not a
// row an event: a batch's 1,000 rows, each repeating its period's totals,
// cost more than computing them (4.9 ms against 3.4 for 1,000 events of
// one month; docs/benchmarks.md, "A row a period").
var periodsSQL = `
	WITH ev AS (
		SELECT e.ts, e.ord FROM unnest($2::timestamptz[]) WITH ORDINALITY AS e (ts, ord)
	), p AS (
		SELECT ev.ord, coalesce((
			SELECT s.current_period_start FROM tenant_subscriptions s
			WHERE s.tenant_id = $1 AND s.current_period_start <= ev.ts AND ev.ts < s.current_period_end
			ORDER BY s.current_period_start DESC LIMIT 1), date_trunc('month', ev.ts, 'UTC')) AS start
		FROM ev
	), tot AS (
		SELECT d.start, coalesce(sum(a.input_tokens), 0)::bigint AS i, coalesce(sum(a.output_tokens), 0)::bigint AS o,
			` + closedStartSQL + ` AS closed
		FROM (SELECT DISTINCT start FROM p) d
		LEFT JOIN allowance_usage a ON a.tenant_id = $1 AND a.period_start = d.start
		GROUP BY d.start
	)
	SELECT tot.start, tot.i, tot.o, t.included_input_tokens, t.included_output_tokens, now(),
		t.included_meters, (SELECT version FROM meter_catalog), tot.closed,
		(SELECT array_agg(p.ord::int) FROM p WHERE p.start = tot.start)
	FROM tot CROSS JOIN tenants t
	WHERE t.id = $1`

// extraTotalsSQL reads the totals of every non-default meter of the tenant
// $1 in each period an event may fall in: $2 the calendar months (UTC) of
// the events' timestamps, and every subscription period overlapping their
// span, $3 to $4 (earliest and latest timestamp). That is every period
// periodsSQL computes for them, and maybe more (a total of a period no
// event falls in is never used), without periodsSQL's lookup of a
// subscription per event. The months are the caller's (eventMonths): a
// batch's 1,000 timestamps have one or two, and truncating each in SQL
// was most of this read's time. Queued only while the catalog has such
// meters.
const extraTotalsSQL = `
	WITH p AS (
		SELECT unnest($2::timestamptz[]) AS start
		UNION
		SELECT s.current_period_start FROM tenant_subscriptions s
		WHERE s.tenant_id = $1 AND s.current_period_start <= $4::timestamptz AND $3::timestamptz < s.current_period_end
	)
	SELECT m.period_start, m.meter, sum(m.tokens)::bigint
	FROM p JOIN meter_usage m ON m.tenant_id = $1 AND m.period_start = p.start
	GROUP BY 1, 2`

// eventMonths are the distinct calendar months (UTC) of events'
// timestamps, and the earliest and latest timestamp: extraTotalsSQL's
// arguments.
func eventMonths(events []*Event) (months pgArray[pgTimestamptz], lo, hi time.Time) {
	var last time.Time
	for i, ev := range events {
		ts := ev.Timestamp.UTC()
		if i == 0 || ts.Before(lo) {
			lo = ts
		}
		if i == 0 || ts.After(hi) {
			hi = ts
		}
		m := time.Date(ts.Year(), ts.Month(), 1, 0, 0, 0, 0, time.UTC)
		if i > 0 && m.Equal(last) {
			continue
		}
		last = m
		if !slices.ContainsFunc(months, func(x pgTimestamptz) bool { return time.Time(x).Equal(m) }) {
			months = append(months, pgTimestamptz(m))
		}
	}
	return months, lo, hi
}

// tenantAllowanceSQL reads the tenant's allowances and the transaction's
// now(), for a transaction whose first pipeline did not (a delta log's).
const tenantAllowanceSQL = `SELECT included_input_tokens, included_output_tokens, included_meters, now() FROM tenants WHERE id = $1`

// queuePeriodTotals queues the re-read of the periods' totals after their
// locks (lockPeriods): allowance_usage's, then, when o.meters is not nil,
// meter_usage's (every meter's, or those named). With o.rows the rows are
// locked, in the order every writer takes them.
func queuePeriodTotals(b *pgx.Batch, tenantID uuid.UUID, periods []time.Time, o periodLocks) {
	if o.rows {
		b.Queue(`SELECT period_start, sum(input_tokens)::bigint, sum(output_tokens)::bigint FROM (
				SELECT period_start, input_tokens, output_tokens FROM allowance_usage
				WHERE tenant_id = $1 AND period_start = ANY($2) ORDER BY period_start, slot FOR UPDATE) AS a
			GROUP BY period_start`, pgUUID(tenantID), periods)
	} else {
		b.Queue(`SELECT period_start, sum(input_tokens)::bigint, sum(output_tokens)::bigint FROM allowance_usage
			WHERE tenant_id = $1 AND period_start = ANY($2) GROUP BY period_start`, pgUUID(tenantID), periods)
	}
	switch {
	case o.meters == nil:
	case o.rows:
		b.Queue(`SELECT period_start, meter, sum(tokens)::bigint FROM (
				SELECT period_start, meter, tokens FROM meter_usage
				WHERE tenant_id = $1 AND period_start = ANY($2) AND meter = ANY($3)
				ORDER BY period_start, meter COLLATE "C", slot FOR UPDATE) AS m
			GROUP BY 1, 2`, pgUUID(tenantID), periods, o.meters)
	default:
		b.Queue(`SELECT period_start, meter, sum(tokens)::bigint FROM meter_usage
			WHERE tenant_id = $1 AND period_start = ANY($2) GROUP BY 1, 2`, pgUUID(tenantID), periods)
	}
}

// queueAllowanceTotals adds w's tokens of the default meters to their
// period totals: an ordered period's slot 0, else the transaction's slot,
// in (period, slot) order. A period where the logs gave the default
// meters no tokens is left alone (a per-model catalog's events may feed
// neither): adding nothing would only write a new version of its row.
func queueAllowanceTotals(b *pgx.Batch, tenantID uuid.UUID, st *state, w *writes) {
	n := len(w.deltaOrder)
	starts, ordered := make([]time.Time, 0, n), make([]bool, 0, n)
	ins, outs := make([]int64, 0, n), make([]int64, 0, n)
	for _, p := range w.deltaOrder {
		if d := w.deltas[p]; d.InputTokens != 0 || d.OutputTokens != 0 {
			starts, ordered = append(starts, p), append(ordered, st.ordered[p])
			ins, outs = append(ins, d.InputTokens), append(outs, d.OutputTokens)
		}
	}
	if len(starts) == 0 {
		return
	}
	b.Queue(`INSERT INTO allowance_usage AS a (tenant_id, period_start, slot, input_tokens, output_tokens)
		SELECT $1, d.start, CASE WHEN d.ordered THEN 0 ELSE $6::smallint END, d.i, d.o
		FROM unnest($2::timestamptz[], $3::bool[], $4::bigint[], $5::bigint[]) AS d (start, ordered, i, o)
		ORDER BY 2, 3
		ON CONFLICT (tenant_id, period_start, slot) DO UPDATE
		SET input_tokens = a.input_tokens + EXCLUDED.input_tokens,
		    output_tokens = a.output_tokens + EXCLUDED.output_tokens`,
		pgUUID(tenantID), starts, ordered, ins, outs, st.slot)
}

// errAllowanceGivenBack: a correction gave allowance back to a period this
// transaction charged without ordering (see queueUsedUpGuard). It rolled
// back whole; the next attempt reads the lower total and takes the ordered
// path.
var errAllowanceGivenBack = errors.New("a correction gave allowance back to the period meanwhile")

// queueUsedUpGuard keeps the unordered path exact against corrections. An
// unordered period was charged all its tokens because its committed total
// had reached the allowance, relying on totals only growing — which a
// correction (or a lowering final checkpoint) breaks: it lowers the total
// under the period's exclusive lock. So before writing, the transaction
// takes that lock shared (unordered transactions never wait for each
// other) and checks, in a statement that starts after the lock is granted,
// that the total is still at or above the allowance; if a correction
// committed in between, the check divides by zero and the transaction
// rolls back to be retried. A correction that comes later waits for this
// transaction's commit and then counts its tokens.
//
// A tenant without allowance needs none of this: no total is ever below
// zero.
//
// Only what the transaction charged counts: a default meter it gave no
// tokens in a period is not checked there (its total may stay below the
// allowance: needsOrder did not order for it), and a period where it
// charged no meter with an allowance takes no lock.
func queueUsedUpGuard(b *pgx.Batch, tenantID uuid.UUID, st *state, periods []time.Time, deltas map[time.Time]*overage.Overage, extra []meterDelta) {
	guarded := map[time.Time]bool{}
	// The other meters with an allowance this transaction charged in an
	// unordered period.
	var extraPeriods []time.Time
	var extraKeys []string
	var extraIncs []int64
	for _, d := range extra {
		if inc := st.included[d.meter]; inc > 0 && !st.ordered[d.period] {
			extraPeriods, extraKeys, extraIncs = append(extraPeriods, d.period), append(extraKeys, d.meter), append(extraIncs, inc)
			guarded[d.period] = true
		}
	}
	// The default meters': each unordered period's allowance of each
	// default meter charged there (0: not charged, nothing to check).
	var unordered []time.Time
	var minIn, minOut []int64
	for _, p := range periods {
		if st.ordered[p] {
			continue
		}
		var in, out int64
		if deltas[p].InputTokens > 0 {
			in = st.allowance.InputTokens
		}
		if deltas[p].OutputTokens > 0 {
			out = st.allowance.OutputTokens
		}
		if in > 0 || out > 0 {
			unordered, minIn, minOut = append(unordered, p), append(minIn, in), append(minOut, out)
			guarded[p] = true
		}
	}
	if len(guarded) == 0 {
		return
	}
	type lock struct{ a, b int32 }
	locks := make([]lock, 0, len(guarded))
	for p := range guarded {
		a, b := periodLockKey(tenantID, p)
		locks = append(locks, lock{a, b})
	}
	slices.SortFunc(locks, func(x, y lock) int {
		if c := cmp.Compare(x.a, y.a); c != 0 {
			return c
		}
		return cmp.Compare(x.b, y.b)
	})
	for _, l := range locks {
		b.Queue(`SELECT pg_advisory_xact_lock_shared($1::int4, $2::int4)`, l.a, l.b)
	}
	if len(unordered) > 0 {
		b.Queue(`SELECT 1 / CASE WHEN count(*) = 0 THEN 1 ELSE 0 END FROM (
				SELECT a.period_start FROM allowance_usage a
				JOIN unnest($2::timestamptz[], $3::bigint[], $4::bigint[]) AS d (start, i, o) ON a.period_start = d.start
				WHERE a.tenant_id = $1
				GROUP BY a.period_start, d.i, d.o HAVING sum(a.input_tokens) < d.i OR sum(a.output_tokens) < d.o) AS given_back`,
			pgUUID(tenantID), unordered, minIn, minOut)
	}
	if len(extraKeys) > 0 {
		// The same for every other meter with an allowance: charged whole
		// only because its total had reached it.
		b.Queue(`SELECT 1 / CASE WHEN count(*) = 0 THEN 1 ELSE 0 END
			FROM unnest($2::timestamptz[], $3::text[], $4::bigint[]) AS a (start, meter, included)
			WHERE (SELECT coalesce(sum(m.tokens), 0) FROM meter_usage m
				WHERE m.tenant_id = $1 AND m.period_start = a.start AND m.meter = a.meter) < a.included`,
			pgUUID(tenantID), extraPeriods, extraKeys, extraIncs)
	}
}

// queueMeterTotals adds the tokens of the meters other than the defaults
// to their period totals: an ordered period's slot 0, else the
// transaction's slot, in (period, meter, slot) order, after
// allowance_usage (every writer takes the two tables in that order).
func queueMeterTotals(b *pgx.Batch, tenantID uuid.UUID, st *state, deltas []meterDelta) {
	n := len(deltas)
	starts, meters, slots, tokens := make([]time.Time, n), make([]string, n), make([]int16, n), make([]int64, n)
	for i, d := range deltas {
		starts[i], meters[i], tokens[i] = d.period, d.meter, d.tokens
		if !st.ordered[d.period] {
			slots[i] = st.slot
		}
	}
	b.Queue(`INSERT INTO meter_usage AS a (tenant_id, period_start, meter, slot, tokens)
		SELECT $1, d.start, d.meter, d.slot, d.tokens
		FROM unnest($2::timestamptz[], $3::text[], $4::smallint[], $5::bigint[]) AS d (start, meter, slot, tokens)
		ORDER BY d.start, d.meter COLLATE "C", d.slot
		ON CONFLICT (tenant_id, period_start, meter, slot) DO UPDATE SET tokens = a.tokens + EXCLUDED.tokens`,
		pgUUID(tenantID), starts, meters, slots, tokens)
}
