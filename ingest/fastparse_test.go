package ingest

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/fastjson"
)

var (
	fastNow    = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	fastTenant = uuid.MustParse("6f1c2a3e-0b7d-4c59-9a61-1d2e3f405162")
)

// fastEventBodies are events the fast parsers take or must leave to the
// decoder path: the seeds of FuzzFastParse, alone and in batches.
var fastEventBodies = []string{
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2}`,
	` { "request_id" : "r1" , "user_id":"u","model_id":"m","input_tokens":0,"output_tokens":2,"timestamp":"2026-11-30T10:00:00.123456789+14:00"}` + "\n\t",
	`{"user_id":"u","model_id":"m","input_tokens":1099511627776,"output_tokens":0,"timestamp":"2026-11-30T10:00:00Z"}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1099511627777,"output_tokens":2}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":0,"output_tokens":0}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":-0,"output_tokens":2}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":01,"output_tokens":2}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1.0,"output_tokens":2}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1e3,"output_tokens":2}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":"1","output_tokens":2}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"input_tokens":3}`,
	`{"request_id":"r\u0031","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"request_id":"","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"request_id":null,"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"request_id":"r1","user_id":"é😀","model_id":"m","input_tokens":1,"output_tokens":2}`,
	"{\"request_id\":\"r1\",\"user_id\":\"\xff\",\"model_id\":\"m\",\"input_tokens\":1,\"output_tokens\":2}",
	`{"request_id":"r1","user_id":"` + strings.Repeat("u", 255) + `","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"request_id":"r1","user_id":"` + strings.Repeat("u", 256) + `","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"timestamp":"2026-12-30T10:00:00Z"}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"timestamp":"2025-12-30T10:00:00Z"}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"timestamp":"yesterday"}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"tenant_id":"6f1c2a3e-0b7d-4c59-9a61-1d2e3f405162"}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"tenant_id":"{6f1c2a3e-0b7d-4c59-9a61-1d2e3f405162}"}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"tenant_id":"00000000-0000-0000-0000-000000000001"}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"tenant_id":"nope"}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"stream":{"id":"s","final":true}}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"extra":1}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2}}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2} x`,
	`{"user_id":"u","model_id":"m","input_tokens":1}`,
	`{}`,
	`[]`,
	``,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":5,"cache_read_input_tokens":4,"cache_creation_input_tokens":6,"reasoning_output_tokens":5}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":5,"cache_read_input_tokens":4,"cache_creation_input_tokens":7}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":5,"cache_read_input_tokens":11}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":5,"reasoning_output_tokens":6}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":5,"reasoning_output_tokens":0,"reasoning_output_tokens":0}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":5,"cache_read_input_tokens":null}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":0,"output_tokens":0,"cache_read_input_tokens":0}`,
}

// fastBatchBodies are batches for FuzzFastParse besides each event alone.
var fastBatchBodies = []string{
	`{"events":[` + fastEventBodies[0] + `,` + strings.Replace(fastEventBodies[0], "r1", "r2", 1) + `]}`,
	`{"events":[` + fastEventBodies[0] + `,` + fastEventBodies[0] + `]}`,
	` {"events" : [ ` + fastEventBodies[1] + ` ] } `,
	`{"events":[` + fastEventBodies[0] + `],"events":[` + fastEventBodies[0] + `]}`,
	`{"events":[` + fastEventBodies[0] + `]]}`,
	`{"events":[` + fastEventBodies[0] + `]} {}`,
	`{"events":[]}`,
	`{"events":null}`,
	`{"Events":[` + fastEventBodies[0] + `]}`,
	string(benchBatchBody(MaxBatchEvents)),
	string(benchBatchBody(MaxBatchEvents + 1)),
}

// TestFastParsersTakeHonestBodies: the bodies clients send take the fast
// path (else the fast parsers would only cost time), and what they decide
// is what the decoder path decides.
func TestFastParsersTakeHonestBodies(t *testing.T) {
	t.Parallel()
	for _, body := range []string{fastEventBodies[0], fastEventBodies[1], fastEventBodies[2], fastEventBodies[14], fastEventBodies[16], fastEventBodies[21], fastEventBodies[34]} {
		if _, ok := fastEvent([]byte(body)); !ok {
			t.Errorf("the fast parser leaves %s to the decoder", body)
		}
		checkFastEvent(t, []byte(body))
	}
	for _, body := range []string{fastBatchBodies[0], fastBatchBodies[2], string(benchBatchBody(MaxBatchEvents))} {
		if _, ok := fastBatch([]byte(body)); !ok {
			t.Errorf("the fast parser leaves %.100s to the decoder", body)
		}
		checkFastBatch(t, []byte(body))
	}
	for _, body := range fastBatchBodies {
		checkFastBatch(t, []byte(body))
	}
	for _, body := range fastEventBodies {
		checkFastEvent(t, []byte(body))
		checkFastBatch(t, []byte(`{"events":[`+body+`]}`))
	}
}

// decoderOnlyFields are the fields the decoder path takes that the fast
// parser leaves to it on purpose, and why.
var decoderOnlyFields = map[string]string{
	"stream": "a stream checkpoint has rules of its own (stream.go) and is rarer than a plain event",
}

// fastFieldSamples are a valid value of each field an honest body may add
// to fastEventBodies[0] (which names the required ones).
var fastFieldSamples = map[string]string{
	"request_id": `"r1"`, "user_id": `"u"`, "model_id": `"m"`, "input_tokens": "10", "output_tokens": "5",
	fieldTimestamp: `"2026-11-30T10:00:00Z"`, "tenant_id": `"` + fastTenant.String() + `"`,
	fieldCacheRead: "1", fieldCacheWrite: "1", fieldReasoning: "1",
}

// TestFastParserKnowsEveryField: a field the decoder path takes (its
// knownFields) and the fast parser does not know would send every body
// naming it down the slow path without anyone noticing. Each is in
// fastjson.Fields, and a body naming it takes the fast path and agrees with
// the decoder, or it is in decoderOnlyFields with the reason.
func TestFastParserKnowsEveryField(t *testing.T) {
	t.Parallel()
	fast := map[string]bool{}
	for _, name := range fastjson.Fields {
		fast[name] = true
		if !knownFields[name] {
			t.Errorf("the fast parser reads %q, which the decoder path refuses as unknown", name)
		}
	}
	for name := range knownFields {
		_, slowOnly := decoderOnlyFields[name]
		switch {
		case slowOnly && fast[name]:
			t.Errorf("%q is read by the fast parser and listed in decoderOnlyFields: remove it from the list", name)
		case slowOnly:
			continue
		case !fast[name]:
			t.Errorf("the decoder path takes %q and the fast parser does not know it: every body naming it takes the slow path; add it to internal/fastjson (Event, Fields, fastScan.event) or to decoderOnlyFields with the reason", name)
			continue
		}
		sample, ok := fastFieldSamples[name]
		if !ok {
			t.Errorf("no sample value for %q in fastFieldSamples", name)
			continue
		}
		base := fastEventBodies[0]
		body := base[:len(base)-1] + `,"` + name + `":` + sample + `}`
		if strings.Contains(base, `"`+name+`"`) {
			body = base // a required field: the base body names it
		}
		if _, ok := fastEvent([]byte(body)); !ok {
			t.Errorf("fastjson.Fields names %q, but the fast parser leaves %s to the decoder", name, body)
		}
		checkFastEvent(t, []byte(body))
	}
}

// TestFastEventFieldsAreEventFields: every field of fastjson.Event is a
// field of Event of the same type, and setFromFast copies it.
func TestFastEventFieldsAreEventFields(t *testing.T) {
	t.Parallel()
	rid, id, n := "r", fastTenant, int64(7)
	f := fastjson.Event{RequestID: &rid, Timestamp: fastNow, UserID: "u", ModelID: "m", InputTokens: 1, OutputTokens: 2,
		Parts: overage.TokenParts{CacheRead: &n, CacheWrite: &n, Reasoning: &n}, TenantID: &id}
	var ev Event
	setFromFast(&ev, &f)
	fv, ev2 := reflect.ValueOf(f), reflect.ValueOf(ev)
	for i := range fv.NumField() {
		field := fv.Type().Field(i)
		if fv.Field(i).IsZero() {
			t.Errorf("fastjson.Event.%s: give it a value in this test", field.Name)
		}
		mine, ok := reflect.TypeFor[Event]().FieldByName(field.Name)
		if !ok || mine.Type != field.Type {
			t.Errorf("fastjson.Event.%s (%s) has no field of that name and type in Event", field.Name, field.Type)
			continue
		}
		if !reflect.DeepEqual(ev2.FieldByName(field.Name).Interface(), fv.Field(i).Interface()) {
			t.Errorf("setFromFast does not copy %s", field.Name)
		}
	}
}

// FuzzFastParse: whenever a fast parser answers, the decoder path accepts
// the body too and gives the same events.
func FuzzFastParse(f *testing.F) {
	for _, s := range fastEventBodies {
		f.Add([]byte(s))
	}
	for _, s := range fastBatchBodies[:len(fastBatchBodies)-2] {
		f.Add([]byte(s))
	}
	for _, s := range hostileBodies {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFastEvent(t, body)
		checkFastBatch(t, body)
		checkFastBatch(t, []byte(`{"events":[`+string(body)+`]}`))
	})
}

func checkFastEvent(t *testing.T, body []byte) {
	t.Helper()
	fast, ok := fastEvent(body)
	if !ok {
		return
	}
	slow, err := parseEventViaDecoder(body, fastNow)
	if err != nil {
		t.Fatalf("the fast parser takes %q, the decoder path refuses it: %v", body, err)
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Fatalf("%q: the fast parser gives %+v, the decoder path %+v", body, fast, slow)
	}
}

func checkFastBatch(t *testing.T, body []byte) {
	t.Helper()
	fast, ok := fastBatch(body)
	if !ok {
		return
	}
	slow, err := parseBatchViaDecoder(body, fastNow, fastTenant)
	if err != nil {
		t.Fatalf("the fast parser takes %.200q, the decoder path refuses it: %v", body, err)
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Fatalf("%.200q: the fast parser and the decoder path give different events", body)
	}
}

// fastEvent and fastBatch are the fast parsers' answer as parseEvent and
// parseBatch take it.
func fastEvent(body []byte) (*Event, bool) {
	rules := fastRules(fastNow, uuid.Nil)
	ev, ok := fastjson.ParseEvent(body, &rules)
	if !ok {
		return nil, false
	}
	return fromFast(&ev), true
}

func fastBatch(body []byte) ([]*Event, bool) {
	rules := fastRules(fastNow, fastTenant)
	evs, ok := fastjson.ParseBatch(body, &rules, setFromFast)
	if !ok {
		return nil, false
	}
	return pointers(evs), true
}
