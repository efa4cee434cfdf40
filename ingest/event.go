package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/fastjson"
)

const (
	maxBodyBytes     = 64 << 10
	maxTextLen       = 255
	maxTokens        = 1 << 40 // far above any LLM call; keeps sums far from overflow
	maxFutureSkew    = overage.MaxFutureSkew
	maxEventAge      = overage.MaxEventAge
	fieldTimestamp   = "timestamp"
	fieldInputTokens = "input_tokens"
)

// Event is a validated usage event.
type Event struct {
	RequestID    *string
	Timestamp    time.Time
	UserID       string
	ModelID      string
	InputTokens  int64
	OutputTokens int64
	// Parts of the totals, when the caller reported them (nil: not sent).
	Parts    overage.TokenParts
	TenantID *uuid.UUID
	// Stream, when set, makes the event a checkpoint of a streaming
	// response: the tokens are the cumulative totals so far (stream.go).
	Stream *Checkpoint
}

var knownFields = map[string]bool{
	"request_id": true, "timestamp": true, "user_id": true, "model_id": true,
	"input_tokens": true, "output_tokens": true, "tenant_id": true, "stream": true,
	fieldCacheRead: true, fieldCacheWrite: true, fieldReasoning: true,
}

// The optional parts of the token totals.
const (
	fieldCacheRead  = "cache_read_input_tokens"
	fieldCacheWrite = "cache_creation_input_tokens"
	fieldReasoning  = "reasoning_output_tokens"
)

// parseEvent decodes and validates a body: through fastjson.ParseEvent when
// it understands the body, else parseEventViaDecoder.
func parseEvent(body []byte, now time.Time) (*Event, error) {
	rules := fastRules(now, uuid.Nil)
	if ev, ok := fastjson.ParseEvent(body, &rules); ok {
		return fromFast(&ev), nil
	}
	return parseEventViaDecoder(body, now)
}

// fastRules are the bounds parseEventViaDecoder and parseBatchViaDecoder
// check, for the fast parsers.
func fastRules(now time.Time, tenantID uuid.UUID) fastjson.Rules {
	return fastjson.Rules{Now: now, MaxFutureSkew: maxFutureSkew, MaxEventAge: maxEventAge,
		MaxTextLen: maxTextLen, MaxTokens: maxTokens, MaxEvents: MaxBatchEvents, TenantID: tenantID}
}

// fromFast is the event the fast parser read.
func fromFast(f *fastjson.Event) *Event {
	ev := &Event{}
	setFromFast(ev, f)
	return ev
}

// setFromFast sets ev to f, field by field
// (TestFastEventFieldsAreEventFields keeps the two types in step).
func setFromFast(ev *Event, f *fastjson.Event) {
	*ev = Event{RequestID: f.RequestID, Timestamp: f.Timestamp, UserID: f.UserID, ModelID: f.ModelID,
		InputTokens: f.InputTokens, OutputTokens: f.OutputTokens, Parts: f.Parts, TenantID: f.TenantID}
}

// parseEventViaDecoder decodes and validates a body, reporting every
// problem at once. Syntax errors are EMALFORMED (400); rule violations are
// EINVALID (422).
func parseEventViaDecoder(body []byte, now time.Time) (*Event, error) {
	raw, err := decodeObject(body, "the body must be a JSON object")
	if err != nil {
		return nil, err
	}
	if err := refuseUnknown(raw, func(k string) bool { return knownFields[k] }); err != nil {
		return nil, err
	}

	var fields []overage.FieldError
	bad := func(field, format string, args ...any) {
		fields = append(fields, overage.FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
	}

	ev := &Event{}
	text := func(name string, required bool) *string {
		v, ok := raw[name]
		if !ok || string(v) == "null" {
			if required {
				bad(name, "is required")
			}
			return nil
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			bad(name, "must be a string")
			return nil
		}
		if s == "" || len(s) > maxTextLen {
			bad(name, "must be 1 to %d characters", maxTextLen)
			return nil
		}
		if strings.ContainsRune(s, 0) { // PostgreSQL's text cannot hold it
			bad(name, "must not contain the NUL character")
			return nil
		}
		return &s
	}
	tokens := func(name string) int64 {
		v, ok := raw[name]
		if !ok || string(v) == "null" {
			bad(name, "is required")
			return 0
		}
		// Integers only: "1e3" or "12.0" are refused rather than rounded,
		// because a billing quantity must be exactly what the caller meant.
		s := string(v)
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			if s != "" && (s[0] == '-' || (s[0] >= '0' && s[0] <= '9')) {
				bad(name, "must be a non-negative integer, got %s", s)
			} else {
				bad(name, "must be an integer")
			}
			return 0
		}
		if n < 0 {
			bad(name, "must be a non-negative integer, got %d", n)
			return 0
		}
		if n > maxTokens {
			bad(name, "must be at most %d", int64(maxTokens))
			return 0
		}
		return n
	}

	ev.RequestID = text("request_id", false)
	if s := text("user_id", true); s != nil {
		ev.UserID = *s
	}
	if s := text("model_id", true); s != nil {
		ev.ModelID = *s
	}
	ev.InputTokens = tokens(fieldInputTokens)
	ev.OutputTokens = tokens("output_tokens")
	part := func(name string) *int64 {
		if v, ok := raw[name]; !ok || string(v) == "null" {
			return nil
		}
		n := tokens(name)
		return &n
	}
	ev.Parts = overage.TokenParts{CacheRead: part(fieldCacheRead), CacheWrite: part(fieldCacheWrite), Reasoning: part(fieldReasoning)}
	if len(fields) == 0 {
		if in := ev.Parts.Input(); in > ev.InputTokens {
			name := fieldCacheWrite
			if ev.Parts.CacheWrite == nil || (ev.Parts.CacheRead != nil && *ev.Parts.CacheRead > ev.InputTokens) {
				name = fieldCacheRead
			}
			bad(name, "makes %d cached input tokens, more than input_tokens (%d), which includes them", in, ev.InputTokens)
		}
		if ev.Parts.Reasoning != nil && *ev.Parts.Reasoning > ev.OutputTokens {
			bad(fieldReasoning, "is %d, more than output_tokens (%d), which includes it", *ev.Parts.Reasoning, ev.OutputTokens)
		}
	}
	if v, ok := raw["stream"]; ok && string(v) != "null" {
		// The parts, like the totals, are the stream's so far (cumulative).
		ev.Stream = parseStream(v, bad)
		if ev.RequestID == nil && raw["request_id"] == nil {
			bad("request_id", "is required for a stream checkpoint")
		}
	}
	// A stream's first checkpoint may report nothing yet.
	if len(fields) == 0 && ev.Stream == nil && ev.InputTokens == 0 && ev.OutputTokens == 0 {
		bad("input_tokens", "is zero, and so is output_tokens: nothing to record")
	}

	// Microseconds, what PostgreSQL stores: the answer, rendered before the
	// insert, shows the instant a later read returns.
	ev.Timestamp = now.UTC().Truncate(time.Microsecond)
	if s := text(fieldTimestamp, false); s != nil {
		ts, err := time.Parse(time.RFC3339Nano, *s)
		switch {
		case err != nil:
			bad(fieldTimestamp, "must be an RFC 3339 time such as 2026-11-29T10:00:00Z")
		case ts.After(now.Add(maxFutureSkew)):
			bad(fieldTimestamp, "is more than 5 minutes in the future")
		case ts.Before(now.Add(-maxEventAge)):
			bad(fieldTimestamp, "is older than 35 days; Stripe does not accept usage that old")
		default:
			// Microseconds: what PostgreSQL stores, so a replayed and a
			// re-read timestamp are the same instant.
			ev.Timestamp = ts.UTC().Truncate(time.Microsecond)
		}
	}
	if s := text("tenant_id", false); s != nil {
		id, err := uuid.Parse(*s)
		if err != nil {
			bad("tenant_id", "must be a UUID")
		} else {
			ev.TenantID = &id
		}
	}

	if len(fields) > 0 {
		return nil, overage.Invalid(fields, "the usage event is invalid: %s", describe(fields))
	}
	return ev, nil
}

// decodeObject decodes a body that must be one JSON object; notObject is
// the complaint when it is valid JSON of another kind.
func decodeObject(body []byte, notObject string) (map[string]json.RawMessage, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&raw); err != nil || raw == nil {
		msg := notObject
		if err != nil {
			msg = fmt.Sprintf("the body is not valid JSON: %v", err)
		}
		return nil, malformed("body", msg)
	}
	if dec.More() {
		return nil, malformed("body", "unexpected data after the JSON object")
	}
	return raw, nil
}

// refuseUnknown names every field of raw that known does not accept.
func refuseUnknown(raw map[string]json.RawMessage, known func(string) bool) error {
	var unknown []string
	for k := range raw {
		if !known(k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	e := overage.Errorf(overage.EMALFORMED, "malformed-request", "unknown field(s): %s", strings.Join(unknown, ", "))
	for _, k := range unknown {
		e.Fields = append(e.Fields, overage.FieldError{Field: k, Detail: "unknown field"})
	}
	return e
}

func describe(fields []overage.FieldError) string {
	parts := make([]string, len(fields))
	for i, f := range fields {
		parts[i] = f.Field + " " + f.Detail
	}
	return strings.Join(parts, "; ")
}

func malformed(field, msg string) error {
	e := overage.Errorf(overage.EMALFORMED, "malformed-request", "%s", msg)
	e.Fields = []overage.FieldError{{Field: field, Detail: msg}}
	return e
}
