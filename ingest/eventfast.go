package ingest

import (
	"bytes"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// The fast event parsers read the bodies honest clients send straight into
// Event, without encoding/json: decoding every event of a batch into a map
// of json.RawMessage and then each field again was a quarter of serve's CPU
// on batches. They answer ok only for a body that is valid in every way the
// decoder path checks — plain strings (no escape), non-negative integers,
// known fields each at most once, no stream checkpoint — so any body they
// refuse, for whatever reason, goes to parseBatch or parseEvent, which word
// every refusal exactly as before. FuzzFastParse checks that whenever a fast
// parser answers, the decoder path gives the same events.

// parseBatchFast is parseBatch for a body it fully understands.
func parseBatchFast(body []byte, now time.Time, tenantID uuid.UUID) ([]*Event, bool) {
	if !utf8.Valid(body) {
		return nil, false
	}
	p := fastScan{data: body, s: string(body), now: now, noTime: now.UTC().Truncate(time.Microsecond)}
	p.space()
	if !p.next('{') {
		return nil, false
	}
	p.space()
	if name, ok := p.plainString(); !ok || name != "events" {
		return nil, false
	}
	p.space()
	if !p.next(':') {
		return nil, false
	}
	p.space()
	if !p.next('[') {
		return nil, false
	}
	// Events are built in place and pointed to once the slices stop
	// growing; every event names a model_id, so they rarely grow.
	n := min(bytes.Count(body, []byte(`"model_id"`)), MaxBatchEvents)
	evs := make([]Event, 0, n)
	rids := make([]string, 0, n)
	for {
		p.space()
		var ev Event
		rid, hasRID, ok := p.event(&ev)
		// A checkpoint, a missing request_id or another tenant's event is
		// an error the decoder path words.
		if !ok || !hasRID || (ev.TenantID != nil && *ev.TenantID != tenantID) || len(evs) == MaxBatchEvents {
			return nil, false
		}
		evs = append(evs, ev)
		rids = append(rids, rid)
		p.space()
		if p.next(',') {
			continue
		}
		if p.next(']') {
			break
		}
		return nil, false
	}
	p.space()
	if !p.next('}') {
		return nil, false
	}
	p.space()
	if p.i != len(p.data) {
		return nil, false
	}
	seen := make(map[string]struct{}, len(rids))
	for _, rid := range rids {
		if _, dup := seen[rid]; dup {
			return nil, false
		}
		seen[rid] = struct{}{}
	}
	events := make([]*Event, len(evs))
	for i := range evs {
		evs[i].RequestID = &rids[i]
		events[i] = &evs[i]
	}
	return events, true
}

// parseEventFast is parseEvent for a body it fully understands.
func parseEventFast(body []byte, now time.Time) (*Event, bool) {
	if !utf8.Valid(body) {
		return nil, false
	}
	p := fastScan{data: body, s: string(body), now: now, noTime: now.UTC().Truncate(time.Microsecond)}
	p.space()
	ev := &Event{}
	rid, hasRID, ok := p.event(ev)
	if !ok {
		return nil, false
	}
	p.space()
	if p.i != len(p.data) {
		return nil, false
	}
	if hasRID {
		ev.RequestID = &rid
	}
	return ev, true
}

// fastScan reads a body already known to be valid UTF-8.
type fastScan struct {
	data []byte
	// s holds the same bytes, so the strings of an event are slices of it
	// rather than one allocation each.
	s   string
	i   int
	now time.Time
	// noTime is the timestamp of an event that names none.
	noTime time.Time
	// slab holds the optional counts' values (part).
	slab []int64
}

func (p *fastScan) space() { p.i = skipSpace(p.data, p.i) }

// next consumes c if it is the next byte.
func (p *fastScan) next(c byte) bool {
	if p.i < len(p.data) && p.data[p.i] == c {
		p.i++
		return true
	}
	return false
}

// plainString reads a string without escapes (and so without control
// characters, which JSON allows only escaped).
func (p *fastScan) plainString() (string, bool) {
	if !p.next('"') {
		return "", false
	}
	start := p.i
	for p.i < len(p.data) {
		c := p.data[p.i]
		if c == '"' {
			p.i++
			return p.s[start : p.i-1], true
		}
		if c == '\\' || c < 0x20 {
			return "", false
		}
		p.i++
	}
	return "", false
}

// text reads a text field's value: 1 to maxTextLen bytes. A plain string
// cannot hold NUL.
func (p *fastScan) text() (string, bool) {
	s, ok := p.plainString()
	return s, ok && s != "" && len(s) <= maxTextLen
}

// tokens reads a token count: 0 to maxTokens, as JSON writes it (no sign,
// no leading zero, no fraction or exponent: the delimiter check of the
// caller refuses those).
func (p *fastScan) tokens() (int64, bool) {
	start := p.i
	var n int64
	for p.i < len(p.data) && p.data[p.i] >= '0' && p.data[p.i] <= '9' {
		if p.i-start == 13 { // maxTokens has 13 digits
			return 0, false
		}
		n = n*10 + int64(p.data[p.i]-'0')
		p.i++
	}
	switch {
	case p.i == start, p.data[start] == '0' && p.i-start > 1, n > maxTokens:
		return 0, false
	}
	return n, true
}

// part reads an optional count (cache_read_input_tokens, …) as tokens
// does, into the scan's slab: a batch's parts take one allocation per 256.
// A null is left to the decoder path.
func (p *fastScan) part() (*int64, bool) {
	n, ok := p.tokens()
	if !ok {
		return nil, false
	}
	if len(p.slab) == 0 {
		p.slab = make([]int64, 256)
	}
	v := &p.slab[0]
	p.slab = p.slab[1:]
	*v = n
	return v, true
}

// Fields of an event, for fastScan.event's check that each comes at most
// once.
const (
	fastRequestID = 1 << iota
	fastUserID
	fastModelID
	fastInput
	fastOutput
	fastTimestamp
	fastTenantID
	fastCacheRead
	fastCacheWrite
	fastReasoning
	fastRequired = fastUserID | fastModelID | fastInput | fastOutput
)

// event reads one event object into ev but for its request_id, which it
// returns (hasRID: the event names one) for the caller to keep where it
// keeps the strings it points to.
func (p *fastScan) event(ev *Event) (rid string, hasRID, ok bool) {
	if !p.next('{') {
		return "", false, false
	}
	seen := 0
	for {
		p.space()
		name, ok := p.plainString()
		if !ok {
			return "", false, false
		}
		p.space()
		if !p.next(':') {
			return "", false, false
		}
		p.space()
		var field int
		switch name {
		case "request_id":
			field = fastRequestID
			rid, ok = p.text()
		case "user_id":
			field = fastUserID
			ev.UserID, ok = p.text()
		case "model_id":
			field = fastModelID
			ev.ModelID, ok = p.text()
		case fieldInputTokens:
			field = fastInput
			ev.InputTokens, ok = p.tokens()
		case "output_tokens":
			field = fastOutput
			ev.OutputTokens, ok = p.tokens()
		case fieldTimestamp:
			field = fastTimestamp
			ok = p.timestamp(ev)
		case fieldCacheRead:
			field = fastCacheRead
			ev.Parts.CacheRead, ok = p.part()
		case fieldCacheWrite:
			field = fastCacheWrite
			ev.Parts.CacheWrite, ok = p.part()
		case fieldReasoning:
			field = fastReasoning
			ev.Parts.Reasoning, ok = p.part()
		case "tenant_id":
			field = fastTenantID
			var s string
			if s, ok = p.text(); ok {
				id, err := uuid.Parse(s)
				ok = err == nil
				ev.TenantID = &id
			}
		default: // a checkpoint, an unknown field
			return "", false, false
		}
		if !ok || seen&field != 0 {
			return "", false, false
		}
		seen |= field
		p.space()
		if p.next(',') {
			continue
		}
		if p.next('}') {
			break
		}
		return "", false, false
	}
	if seen&fastRequired != fastRequired || (ev.InputTokens == 0 && ev.OutputTokens == 0) {
		return "", false, false
	}
	// Parts larger than their totals are refused, worded, by the decoder
	// path.
	if ev.Parts.Input() > ev.InputTokens || (ev.Parts.Reasoning != nil && *ev.Parts.Reasoning > ev.OutputTokens) {
		return "", false, false
	}
	if seen&fastTimestamp == 0 {
		ev.Timestamp = p.noTime
	}
	return rid, seen&fastRequestID != 0, true
}

// timestamp reads an event's timestamp as parseEvent checks it.
func (p *fastScan) timestamp(ev *Event) bool {
	s, ok := p.text()
	if !ok {
		return false
	}
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || ts.After(p.now.Add(maxFutureSkew)) || ts.Before(p.now.Add(-maxEventAge)) {
		return false
	}
	ev.Timestamp = ts.UTC().Truncate(time.Microsecond)
	return true
}
