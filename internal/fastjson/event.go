package fastjson

import (
	"bytes"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
)

// The fast event parsers read the bodies honest clients send straight into
// events, where ingest's decoder path decodes each event into a map of
// json.RawMessage and then each field again. They answer ok only for a
// body that is valid in every way the decoder path checks — plain strings
// (no escape), non-negative integers, known fields each at most once, no
// stream checkpoint — so any body they refuse, for whatever reason, goes to
// the decoder path, which words every refusal. ingest's FuzzFastParse
// checks that whenever a fast parser answers, the decoder path gives the
// same events, and TestFastParserKnowsEveryField that no field the decoder
// path takes is unknown here (but those it lists as its own).

// Event is a usage event as the fast parsers read it: ingest's Event but
// for a stream checkpoint, which they leave to the decoder path.
type Event struct {
	RequestID    *string
	Timestamp    time.Time
	UserID       string
	ModelID      string
	InputTokens  int64
	OutputTokens int64
	Parts        overage.TokenParts
	TenantID     *uuid.UUID
}

// Rules are the bounds ingest's decoder path checks, for the fast parsers
// to check the same.
type Rules struct {
	// Now is the time of the request: a timestamp must lie between
	// Now-MaxEventAge and Now+MaxFutureSkew, and an event that names none
	// gets Now in microseconds.
	Now           time.Time
	MaxFutureSkew time.Duration
	MaxEventAge   time.Duration
	// MaxTextLen bounds a text field in bytes; MaxTokens a token count.
	MaxTextLen int
	MaxTokens  int64
	// MaxEvents bounds a batch; TenantID is the tenant a batch's events
	// may name.
	MaxEvents int
	TenantID  uuid.UUID
}

// Fields are the members of an event the fast parsers read; any other
// makes them leave the body to the decoder path.
var Fields = []string{"request_id", "user_id", "model_id", "input_tokens", "output_tokens", "timestamp", "tenant_id",
	fieldCacheRead, fieldCacheWrite, fieldReasoning}

// The optional parts of the token totals.
const (
	fieldCacheRead  = "cache_read_input_tokens"
	fieldCacheWrite = "cache_creation_input_tokens"
	fieldReasoning  = "reasoning_output_tokens"
)

// ParseBatch reads a batch body {"events": [...]} it fully understands
// into the caller's event type: set copies each event into its element,
// so the events cost one slice and no copy of their own.
func ParseBatch[E any](body []byte, r *Rules, set func(dst *E, ev *Event)) ([]E, bool) {
	if !utf8.Valid(body) {
		return nil, false
	}
	p := fastScan{data: body, s: string(body), r: *r, noTime: r.Now.UTC().Truncate(time.Microsecond)}
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
	// Every event names a model_id, so the slices rarely grow; when rids
	// does, the request_ids already pointed to stay where they were.
	n := min(bytes.Count(body, []byte(`"model_id"`)), r.MaxEvents)
	evs := make([]E, 0, n)
	rids := make([]string, 0, n)
	// One event read into, reused: set sees it through a pointer.
	ev := new(Event)
	for {
		p.space()
		*ev = Event{}
		rid, hasRID, ok := p.event(ev)
		// A checkpoint, a missing request_id or another tenant's event is
		// an error the decoder path words.
		if !ok || !hasRID || (ev.TenantID != nil && *ev.TenantID != r.TenantID) || len(evs) == r.MaxEvents {
			return nil, false
		}
		rids = append(rids, rid)
		ev.RequestID = &rids[len(rids)-1]
		evs = append(evs, *new(E))
		set(&evs[len(evs)-1], ev)
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
	return evs, true
}

// ParseEvent reads the body of one event it fully understands.
func ParseEvent(body []byte, r *Rules) (Event, bool) {
	if !utf8.Valid(body) {
		return Event{}, false
	}
	p := fastScan{data: body, s: string(body), r: *r, noTime: r.Now.UTC().Truncate(time.Microsecond)}
	p.space()
	var ev Event
	rid, hasRID, ok := p.event(&ev)
	if !ok {
		return Event{}, false
	}
	p.space()
	if p.i != len(p.data) {
		return Event{}, false
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
	s string
	i int
	r Rules // a copy, so the caller's does not escape
	// noTime is the timestamp of an event that names none.
	noTime time.Time
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

// text reads a text field's value: 1 to MaxTextLen bytes. A plain string
// cannot hold NUL.
func (p *fastScan) text() (string, bool) {
	s, ok := p.plainString()
	return s, ok && s != "" && len(s) <= p.r.MaxTextLen
}

// tokens reads a token count: 0 to MaxTokens, as JSON writes it (no sign,
// no leading zero, no fraction or exponent: the delimiter check of the
// caller refuses those).
func (p *fastScan) tokens() (int64, bool) {
	start := p.i
	var n int64
	for p.i < len(p.data) && p.data[p.i] >= '0' && p.data[p.i] <= '9' {
		if p.i-start == 18 { // more than any bound: n must not overflow
			return 0, false
		}
		n = n*10 + int64(p.data[p.i]-'0')
		p.i++
	}
	switch {
	case p.i == start, p.data[start] == '0' && p.i-start > 1, n > p.r.MaxTokens:
		return 0, false
	}
	return n, true
}

// part reads an optional part of the totals.
func (p *fastScan) part() (*int64, bool) {
	n, ok := p.tokens()
	if !ok {
		return nil, false
	}
	return &n, true
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
		case "input_tokens":
			field = fastInput
			ev.InputTokens, ok = p.tokens()
		case "output_tokens":
			field = fastOutput
			ev.OutputTokens, ok = p.tokens()
		case "timestamp":
			field = fastTimestamp
			ok = p.timestamp(ev)
		case "tenant_id":
			field = fastTenantID
			var s string
			if s, ok = p.text(); ok {
				id, err := uuid.Parse(s)
				ok = err == nil
				ev.TenantID = &id
			}
		case fieldCacheRead:
			field = fastCacheRead
			ev.Parts.CacheRead, ok = p.part()
		case fieldCacheWrite:
			field = fastCacheWrite
			ev.Parts.CacheWrite, ok = p.part()
		case fieldReasoning:
			field = fastReasoning
			ev.Parts.Reasoning, ok = p.part()
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
	// Parts larger than the totals that include them: the decoder path
	// words it.
	if ev.Parts.Input() > ev.InputTokens || (ev.Parts.Reasoning != nil && *ev.Parts.Reasoning > ev.OutputTokens) {
		return "", false, false
	}
	if seen&fastTimestamp == 0 {
		ev.Timestamp = p.noTime
	}
	return rid, seen&fastRequestID != 0, true
}

// timestamp reads an event's timestamp as the decoder path checks it.
func (p *fastScan) timestamp(ev *Event) bool {
	s, ok := p.text()
	if !ok {
		return false
	}
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || ts.After(p.r.Now.Add(p.r.MaxFutureSkew)) || ts.Before(p.r.Now.Add(-p.r.MaxEventAge)) {
		return false
	}
	ev.Timestamp = ts.UTC().Truncate(time.Microsecond)
	return true
}
