package ingest

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
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
	// The optional counts; parts above their totals, a null and a field twice
	// are left to the decoder path.
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":1200,"output_tokens":350,"cache_read_input_tokens":800}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":5,"cache_read_input_tokens":4,"cache_creation_input_tokens":6,"reasoning_output_tokens":5}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":5,"cache_read_input_tokens":4,"cache_creation_input_tokens":7}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":5,"reasoning_output_tokens":6}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":5,"cache_read_input_tokens":null}`,
	`{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":5,"cache_read_input_tokens":1,"cache_read_input_tokens":2}`,
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
	n := len(fastEventBodies)
	for _, body := range []string{fastEventBodies[0], fastEventBodies[1], fastEventBodies[2], fastEventBodies[14], fastEventBodies[16], fastEventBodies[21],
		fastEventBodies[n-6], fastEventBodies[n-5]} { // with cache reads, cache writes and reasoning
		if _, ok := parseEventFast([]byte(body), fastNow); !ok {
			t.Errorf("the fast parser leaves %s to the decoder", body)
		}
		checkFastEvent(t, []byte(body))
	}
	for _, body := range []string{fastBatchBodies[0], fastBatchBodies[2], string(benchBatchBody(MaxBatchEvents))} {
		if _, ok := parseBatchFast([]byte(body), fastNow, fastTenant); !ok {
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
	fast, ok := parseEventFast(body, fastNow)
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
	fast, ok := parseBatchFast(body, fastNow, fastTenant)
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
