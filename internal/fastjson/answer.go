package fastjson

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
)

// The answers of an ingest are written by hand rather than by json.Marshal,
// which walks UsageLog by reflection. The bytes are json.Marshal's exactly
// — the answer is stored under the key and replayed, and
// TestRenderMatchesJSONMarshal compares the two — and whatever json.Marshal
// would refuse (a time it cannot write as RFC 3339) makes the writer answer
// !ok, for the caller to take json.Marshal and its error.

// LogAnswer is the JSON of a usage log in ingest's answers.
type LogAnswer struct {
	*overage.UsageLog
	Duplicate bool `json:"duplicate"`
}

// BatchEvent is one element of a batch answer.
type BatchEvent struct {
	Index     int  `json:"index"`
	Duplicate bool `json:"duplicate"`
	*overage.UsageLog
}

// BatchAnswer is the JSON of a batch answer.
type BatchAnswer struct {
	Events     []BatchEvent `json:"events"`
	Created    int          `json:"created"`
	Duplicates int          `json:"duplicates"`
}

// RenderLog writes r as json.Marshal does, or answers !ok for the caller
// to take json.Marshal.
func RenderLog(r *LogAnswer) ([]byte, bool) {
	return appendLogResponse(make([]byte, 0, 512), r)
}

// RenderBatch writes resp as json.Marshal does, or answers !ok for the
// caller to take json.Marshal.
func RenderBatch(resp *BatchAnswer) ([]byte, bool) {
	return appendBatchResponse(make([]byte, 0, batchResponseSize(resp.Events)), resp)
}

// AppendBatch is RenderBatch appending to b, for a caller that reuses its
// buffers: a batch answer is about a megabyte, which RenderBatch allocates
// (and the runtime zeroes) anew. BatchSize is about its length.
func AppendBatch(b []byte, resp *BatchAnswer) ([]byte, bool) {
	return appendBatchResponse(b, resp)
}

// BatchSize is about the length of the answer of events (see
// batchResponseSize).
func BatchSize(events []BatchEvent) int { return batchResponseSize(events) }

// appendBatchResponse writes resp as json.Marshal does.
func appendBatchResponse(b []byte, resp *BatchAnswer) ([]byte, bool) {
	if resp.Events == nil {
		return nil, false
	}
	b = append(b, `{"events":[`...)
	for i := range resp.Events {
		e := &resp.Events[i]
		if e.UsageLog == nil {
			return nil, false
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(e.Index), 10)
		b = append(b, `,"duplicate":`...)
		b = strconv.AppendBool(b, e.Duplicate)
		b = append(b, ',')
		var ok bool
		if b, ok = appendUsageLogFields(b, e.UsageLog); !ok {
			return nil, false
		}
		b = append(b, '}')
	}
	b = append(b, `],"created":`...)
	b = strconv.AppendInt(b, int64(resp.Created), 10)
	b = append(b, `,"duplicates":`...)
	b = strconv.AppendInt(b, int64(resp.Duplicates), 10)
	return append(b, '}'), true
}

// batchResponseSize is about the length of a batch answer, for its buffer
// to be allocated once and not much larger: a new log takes about 420
// bytes and its strings, each meter event about 75 (96 with room for an
// identifier), each meter line about 115 (140).
func batchResponseSize(events []BatchEvent) int {
	n := 64
	for _, e := range events {
		if e.UsageLog == nil {
			continue
		}
		n += 420 + len(e.UserID) + len(e.ModelID) + 96*len(e.StripeEvents) + 140*len(e.Meters)
		if e.RequestID != nil {
			n += len(*e.RequestID)
		}
	}
	return n
}

// appendLogResponse writes r as json.Marshal does.
func appendLogResponse(b []byte, r *LogAnswer) ([]byte, bool) {
	if r.UsageLog == nil {
		return nil, false
	}
	b = append(b, '{')
	b, ok := appendUsageLogFields(b, r.UsageLog)
	if !ok {
		return nil, false
	}
	b = append(b, `,"duplicate":`...)
	b = strconv.AppendBool(b, r.Duplicate)
	return append(b, '}'), true
}

func appendUsageLog(b []byte, l *overage.UsageLog) ([]byte, bool) {
	b = append(b, '{')
	b, ok := appendUsageLogFields(b, l)
	return append(b, '}'), ok
}

// appendUsageLogFields writes the members of l, in overage.UsageLog's
// field order with its omitempty rules.
func appendUsageLogFields(b []byte, l *overage.UsageLog) ([]byte, bool) {
	ok := true
	b = append(b, `"id":`...)
	b = appendUUID(b, l.ID)
	b = append(b, `,"tenant_id":`...)
	b = appendUUID(b, l.TenantID)
	b = append(b, `,"request_id":`...)
	b = appendStringPtr(b, l.RequestID)
	b = append(b, `,"timestamp":`...)
	b = appendTime(b, l.Timestamp, &ok)
	b = append(b, `,"user_id":`...)
	b = appendJSONString(b, l.UserID)
	b = append(b, `,"model_id":`...)
	b = appendJSONString(b, l.ModelID)
	b = append(b, `,"input_tokens":`...)
	b = strconv.AppendInt(b, l.InputTokens, 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, l.OutputTokens, 10)
	for _, p := range [...]struct {
		name string
		n    *int64
	}{{`,"cache_read_input_tokens":`, l.CacheRead}, {`,"cache_creation_input_tokens":`, l.CacheWrite}, {`,"reasoning_output_tokens":`, l.Reasoning}} {
		if p.n != nil {
			b = append(b, p.name...)
			b = strconv.AppendInt(b, *p.n, 10)
		}
	}
	b = append(b, `,"overage":`...)
	b = appendOverage(b, l.Overage)
	b = append(b, `,"billing_status":`...)
	b = appendJSONString(b, string(l.BillingStatus))
	b = append(b, `,"billed_at":`...)
	b = appendTimePtr(b, l.BilledAt, &ok)
	b = append(b, `,"created_at":`...)
	b = appendTime(b, l.CreatedAt, &ok)
	if l.FirstAttemptAt != nil {
		b = append(b, `,"first_attempt_at":`...)
		b = appendTime(b, *l.FirstAttemptAt, &ok)
	}
	if l.BillingMessage != nil {
		b = append(b, `,"billing_message":`...)
		b = appendJSONString(b, *l.BillingMessage)
	}
	if len(l.StripeEvents) > 0 {
		b = append(b, `,"stripe_meter_events":[`...)
		for i, e := range l.StripeEvents {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"dimension":`...)
			b = appendJSONString(b, string(e.Dimension))
			b = append(b, `,"identifier":`...)
			b = appendStringPtr(b, e.Identifier)
			b = append(b, `,"value":`...)
			b = strconv.AppendInt(b, e.Value, 10)
			b = append(b, `,"accepted_at":`...)
			b = appendTimePtr(b, e.AcceptedAt, &ok)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if len(l.Meters) > 0 {
		b = append(b, `,"meters":[`...)
		for i, m := range l.Meters {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"meter":`...)
			b = appendJSONString(b, m.Meter)
			b = append(b, `,"event_name":`...)
			b = appendJSONString(b, m.EventName)
			b = append(b, `,"tokens":`...)
			b = strconv.AppendInt(b, m.Tokens, 10)
			b = append(b, `,"overage":`...)
			b = strconv.AppendInt(b, m.Overage, 10)
			b = append(b, `,"identifier":`...)
			b = appendStringPtr(b, m.Identifier)
			b = append(b, `,"accepted_at":`...)
			b = appendTimePtr(b, m.AcceptedAt, &ok)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	b = append(b, `,"kind":`...)
	b = appendJSONString(b, string(l.Kind))
	if l.Corrects != nil {
		b = append(b, `,"corrects":`...)
		b = appendUUID(b, *l.Corrects)
	}
	if l.Reason != nil {
		b = append(b, `,"reason":`...)
		b = appendJSONString(b, *l.Reason)
	}
	if l.CorrectedBy != nil {
		b = append(b, `,"corrected_by":`...)
		b = appendJSONString(b, *l.CorrectedBy)
	}
	if l.StripeTimestamp != "" {
		b = append(b, `,"stripe_timestamp":`...)
		b = appendJSONString(b, l.StripeTimestamp)
	}
	if l.CorrectedTotals != nil {
		b = append(b, `,"corrected_totals":`...)
		b = appendOverage(b, *l.CorrectedTotals)
	}
	if len(l.Corrections) > 0 {
		b = append(b, `,"corrections":[`...)
		for i := range l.Corrections {
			if i > 0 {
				b = append(b, ',')
			}
			var cok bool
			b, cok = appendUsageLog(b, &l.Corrections[i])
			ok = ok && cok
		}
		b = append(b, ']')
	}
	return b, ok
}

func appendOverage(b []byte, o overage.Overage) []byte {
	b = append(b, `{"input_tokens":`...)
	b = strconv.AppendInt(b, o.InputTokens, 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, o.OutputTokens, 10)
	return append(b, '}')
}

// appendUUID writes id as its MarshalText does, quoted.
func appendUUID(b []byte, id uuid.UUID) []byte {
	b = append(b, '"')
	for i, c := range id {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, hexDigits[c>>4], hexDigits[c&0xf])
	}
	return append(b, '"')
}

func appendStringPtr(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return appendJSONString(b, *s)
}

func appendTimePtr(b []byte, t *time.Time, ok *bool) []byte {
	if t == nil {
		return append(b, "null"...)
	}
	return appendTime(b, *t, ok)
}

// appendTime writes t as its MarshalJSON does: RFC 3339 with nanoseconds,
// quoted. It clears ok where MarshalJSON fails: a year outside 0 to 9999
// or a zone offset of 24 hours or more.
func appendTime(b []byte, t time.Time, ok *bool) []byte {
	b = append(b, '"')
	n0 := len(b)
	b = t.AppendFormat(b, time.RFC3339Nano)
	if len(b)-n0 < len("9999-") || b[n0+len("9999")] != '-' {
		*ok = false
	} else if last := b[len(b)-1]; last != 'Z' {
		c := b[len(b)-len("Z07:00")]
		hh := 10*(b[len(b)-len("07:00")]-'0') + (b[len(b)-len("7:00")] - '0')
		if ('0' <= c && c <= '9') || hh >= 24 {
			*ok = false
		}
	}
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// jsonSafe holds the ASCII bytes json.Marshal writes as themselves (with
// its HTML escaping: not <, > or &).
var jsonSafe = func() (safe [utf8.RuneSelf]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		safe[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return safe
}()

// appendJSONString writes s as json.Marshal does (encoding/json's
// appendString with HTML escaping).
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if jsonSafe[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
