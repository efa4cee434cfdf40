package ingest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/meters"
)

// Meters in ingest. The routing of each kind of token to a meter is
// decided here, in the ingest transaction, with the catalog of the
// meter_catalog version the transaction read (a cached catalog is used
// while its version is current), and recorded on the log: the default
// meters in the columns they always had, every other meter as one element
// of the log's meter_* arrays. The split at the allowance is the same rule
// (overage.Split) for every meter, against the meter's own period total:
// allowance_usage for the default meters, meter_usage for the others.

// querier is a pool or a transaction: what reads logs and the catalog.
type querier interface {
	overage.DB
	meters.Querier
}

// extraTotals are the period totals of the meters other than the
// defaults, per period and meter key.
type extraTotals map[time.Time]map[string]int64

func (t extraTotals) add(p time.Time, meter string, n int64) {
	m, ok := t[p]
	if !ok {
		m = map[string]int64{}
		t[p] = m
	}
	m[meter] += n
}

// split computes the meter lines of tokens mts added in period p (an
// event's routed amounts, or a delta log's changes), each line's overage
// split with overage.Split against its meter's running total, and adds the
// tokens to those totals. Lines of the default meters come first (always
// both); other meters only when they got tokens.
func (st *state) split(p time.Time, mts []overage.MeterTokens) ([]overage.MeterLine, error) {
	lines := st.newLines(len(mts))
	tot := st.totals[p]
	var extra map[string]int64 // the period's totals of the other meters
	for i, mt := range mts {
		if i >= 2 && mt.Tokens == 0 {
			continue
		}
		var before, included int64
		switch mt.Meter {
		case overage.MeterInput:
			before, included = tot.InputTokens, st.allowance.InputTokens
		case overage.MeterOutput:
			before, included = tot.OutputTokens, st.allowance.OutputTokens
		default:
			if extra == nil {
				if extra = st.extra[p]; extra == nil {
					extra = map[string]int64{}
					st.extra[p] = extra
				}
			}
			before, included = extra[mt.Meter], st.included[mt.Meter]
		}
		// A total spread over slot rows can pass 2^63-1 here before any
		// one row's upsert would: refuse, as PostgreSQL does (422).
		if mt.Tokens > 0 && before > maxTotal-mt.Tokens {
			return nil, errTotalOverflow
		}
		lines = append(lines, overage.MeterLine{Meter: mt.Meter, Tokens: mt.Tokens, Overage: overage.Split(before, mt.Tokens, included)})
		switch mt.Meter {
		case overage.MeterInput:
			tot.InputTokens += mt.Tokens
		case overage.MeterOutput:
			tot.OutputTokens += mt.Tokens
		default:
			extra[mt.Meter] += mt.Tokens
		}
	}
	return lines, nil
}

// newLines is room for n lines, cut from a block shared by the
// transaction's logs: one allocation for hundreds of lines instead of two
// a log (its lines and their copy on the log), which with three meters an
// event were a fifth of newLogs' allocations.
func (st *state) newLines(n int) []overage.MeterLine {
	if cap(st.lineBlock)-len(st.lineBlock) < n {
		st.lineBlock = make([]overage.MeterLine, 0, max(n, 512))
	}
	i := len(st.lineBlock)
	st.lineBlock = st.lineBlock[:i+n]
	return st.lineBlock[i : i : i+n]
}

const maxTotal = int64(^uint64(0) >> 1)

// billable reports whether any line has overage to send (a correction's
// may be negative, and two lines may cancel in a dimension's sum).
func billable(lines []overage.MeterLine) bool {
	for _, l := range lines {
		if l.Overage != 0 {
			return true
		}
	}
	return false
}

// rawLines are a log's lines as its row holds them (see
// overage.Catalog.Present): default lines with the dimensions' whole
// tokens.
func rawLines(l *overage.UsageLog, lines []overage.MeterLine) []overage.MeterLine {
	return rawLinesInto(make([]overage.MeterLine, 0, len(lines)), l, lines)
}

// rawLinesInto is rawLines appended to raw.
func rawLinesInto(raw []overage.MeterLine, l *overage.UsageLog, lines []overage.MeterLine) []overage.MeterLine {
	raw = append(raw, lines...)
	raw[0].Tokens, raw[1].Tokens = l.InputTokens, l.OutputTokens
	for i := range raw {
		raw[i].EventName, raw[i].Identifier = "", nil
	}
	return raw
}

// needsOrder reports whether the period's new events can be charged
// without ordering: every meter they feed with an allowance has its total
// at or past it (totals only grow, so then each event's overage is all
// its tokens whatever the order). A meter they feed nothing needs no
// order whatever its total: no event's overage on it depends on it. fed
// is the meters fed in the period (fedMeters); all: the catalog has only
// the defaults, taken as both fed.
func (st *state) needsOrder(p time.Time, fed map[string]bool, all bool) bool {
	tot := st.totals[p]
	if (all || fed[overage.MeterInput]) && tot.InputTokens < st.allowance.InputTokens ||
		(all || fed[overage.MeterOutput]) && tot.OutputTokens < st.allowance.OutputTokens {
		return true
	}
	for k := range fed {
		if overage.IsDefaultMeter(k) {
			continue
		}
		if inc := st.included[k]; inc > 0 && (!st.extraRead || st.extra[p][k] < inc) {
			return true
		}
	}
	return false
}

// fedMeters lists, per period, the meters the new events feed tokens,
// the defaults included; nil when the catalog has only the defaults.
// Under a per-model catalog an event may feed neither default meter (the
// meters benchmark's events feed three others), and a tenant's allowance
// on a default it never reaches must not order every transaction.
// Consecutive events of one model and period that feed the same kinds of
// token are routed once.
func (st *state) fedMeters(g *group, fresh []int) map[time.Time]map[string]bool {
	if !st.catalog.Extra() {
		return nil
	}
	fed := map[time.Time]map[string]bool{}
	var last struct {
		model  string
		period time.Time
		kinds  uint8
	}
	for k, i := range fresh {
		ev := g.events[i]
		p := st.periods[i]
		amounts := overage.Amounts(ev.InputTokens, ev.OutputTokens, ev.Parts)
		var kinds uint8
		for t, n := range amounts {
			if n != 0 {
				kinds |= 1 << t
			}
		}
		if k > 0 && kinds == last.kinds && p == last.period && ev.ModelID == last.model {
			continue
		}
		last.model, last.period, last.kinds = ev.ModelID, p, kinds
		f := fed[p]
		if f == nil {
			f = map[string]bool{}
			fed[p] = f
		}
		for t, m := range st.route(ev.ModelID) {
			if amounts[t] != 0 {
				f[m] = true
			}
		}
	}
	return fed
}

// extraAllowances lists the meters other than the defaults with an
// allowance, and the allowances.
func (st *state) extraAllowances() ([]string, []int64) {
	var keys []string
	var incs []int64
	for k, v := range st.included {
		if v > 0 {
			keys = append(keys, k)
			incs = append(incs, v)
		}
	}
	return keys, incs
}

// flatLines are the non-default lines of a statement's logs as arguments:
// each log's meter keys joined by commas (a key is [a-z0-9_]; NULL for a log
// without such lines), flat arrays of the tokens and overage, and each log's
// offset and count in them. The keys are not a flat array sliced per row:
// a text array's elements have no fixed width, so PostgreSQL finds a slice
// by walking the array from its start, and a 1,000-event batch with three
// lines each spent about 15 ms there (the bigint arrays slice at once).
//
// Consecutive logs of one model and catalog feed the same meters: the last
// log's keys are joined once and reused while they repeat, rather than
// built again for every log (two allocations a log).
type flatLines struct {
	keys           pgArray[pgtype.Text]
	tokens, over   pgArray[pgInt8]
	offsets, count []int32
	last           []overage.MeterLine // the non-default lines whose keys are lastJoined
	lastJoined     string
}

// newFlatLines is flatLines sized for the lines of logs (each log's
// lines, the defaults first), so that adding them never grows an array.
func newFlatLines(logs [][]overage.MeterLine) flatLines {
	n := 0
	for _, lines := range logs {
		n += max(0, len(lines)-2)
	}
	f := flatLines{keys: make(pgArray[pgtype.Text], 0, len(logs)),
		offsets: make([]int32, 0, len(logs)), count: make([]int32, 0, len(logs))}
	if n > 0 { // none: the arrays stay nil, as add leaves them
		f.tokens, f.over = make(pgArray[pgInt8], 0, n), make(pgArray[pgInt8], 0, n)
	}
	return f
}

func (f *flatLines) add(lines []overage.MeterLine) {
	f.offsets = append(f.offsets, int32(len(f.tokens)))
	extra := lines[min(2, len(lines)):]
	for _, ln := range extra {
		f.tokens = append(f.tokens, pgInt8(ln.Tokens))
		f.over = append(f.over, pgInt8(ln.Overage))
	}
	if !sameMeters(extra, f.last) {
		var keys strings.Builder
		for i, ln := range extra {
			if i > 0 {
				keys.WriteByte(',')
			}
			keys.WriteString(ln.Meter)
		}
		f.last, f.lastJoined = extra, keys.String()
	}
	f.keys = append(f.keys, pgtype.Text{String: f.lastJoined, Valid: len(extra) > 0})
	f.count = append(f.count, int32(len(extra)))
}

// sameMeters reports whether a and b name the same meters in the same order.
func sameMeters(a, b []overage.MeterLine) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Meter != b[i].Meter {
			return false
		}
	}
	return true
}

// present completes logs read from rows (see overage.Catalog.Present).
func (s *Service) present(ctx context.Context, q meters.Querier, logs ...*overage.UsageLog) error {
	var keys []string
	for _, l := range logs {
		if l != nil {
			keys = append(keys, overage.ExtraKeys(l.Meters)...)
		}
	}
	cat, err := s.meters.Knowing(ctx, q, keys)
	if err != nil {
		return err
	}
	for _, l := range logs {
		if l != nil {
			cat.Present(l)
		}
	}
	return nil
}

// rowLines are the meter lines of a row: the defaults from their columns,
// the others from the arrays.
func rowLines(l *overage.UsageLog, inLead, outLead *uuid.UUID, inAt, outAt *time.Time, keys []string, tokens, over []int64,
	leads []pgtype.UUID, accepted []pgtype.Timestamptz) ([]overage.MeterLine, error) {
	lines := make([]overage.MeterLine, 2, 2+len(keys))
	lines[0] = overage.MeterLine{Meter: overage.MeterInput, Tokens: l.InputTokens, Overage: l.Overage.InputTokens, Lead: inLead, AcceptedAt: utcPtr(inAt)}
	lines[1] = overage.MeterLine{Meter: overage.MeterOutput, Tokens: l.OutputTokens, Overage: l.Overage.OutputTokens, Lead: outLead, AcceptedAt: utcPtr(outAt)}
	if len(tokens) != len(keys) || len(over) != len(keys) {
		return nil, fmt.Errorf("usage log %s: meter arrays of %d, %d and %d elements", l.ID, len(keys), len(tokens), len(over))
	}
	for i, k := range keys {
		ln := overage.MeterLine{Meter: k, Tokens: tokens[i], Overage: over[i]}
		if i < len(leads) && leads[i].Valid {
			id := uuid.UUID(leads[i].Bytes)
			ln.Lead = &id
		}
		if i < len(accepted) && accepted[i].Valid {
			t := accepted[i].Time.UTC()
			ln.AcceptedAt = &t
		}
		lines = append(lines, ln)
	}
	return lines, nil
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// presentAll presents the logs of maps read in an ingest transaction with
// its catalog, or a newer one when a log names a meter it lacks.
func (s *Service) presentAll(ctx context.Context, q meters.Querier, cat *overage.Catalog, recorded map[uuid.UUID]*overage.UsageLog,
	earlier map[string]*overage.UsageLog) error {
	logs := make([]*overage.UsageLog, 0, len(recorded)+len(earlier))
	for _, l := range recorded {
		logs = append(logs, l)
	}
	for _, l := range earlier {
		logs = append(logs, l)
	}
	for _, l := range logs {
		for _, k := range overage.ExtraKeys(l.Meters) {
			if _, ok := cat.Meter(k); !ok {
				return s.present(ctx, q, logs...)
			}
		}
	}
	for _, l := range logs {
		cat.Present(l)
	}
	return nil
}

// asRecordedLines are lines as they were when their log was recorded:
// in no report, nothing accepted.
func asRecordedLines(lines []overage.MeterLine) ([]overage.MeterLine, []overage.StripeEvent) {
	out := make([]overage.MeterLine, len(lines))
	var events []overage.StripeEvent
	for i, ln := range lines {
		ln.Lead, ln.Identifier, ln.AcceptedAt = nil, nil, nil
		out[i] = ln
		if ln.Overage != 0 {
			events = append(events, overage.StripeEvent{Dimension: overage.Dimension(ln.Meter), Value: ln.Overage})
		}
	}
	return out, events
}
