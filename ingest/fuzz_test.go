package ingest

import (
	"bytes"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/testkit/jsonvalue"
)

// The fuzz targets below run their checked-in corpora (testdata/fuzz/...)
// and seeds as ordinary tests; `make fuzz` explores each for a minute.
// FuzzCanonicalJSON is internal/fastjson's.

// hostileBodies are the seeds every body target starts from.
var hostileBodies = jsonvalue.HostileBodies

// FuzzFingerprintIsSameRequest: two bodies are the same request (one
// fingerprint) exactly when they are the same JSON value — never when they
// differ, whatever key order, whitespace, escapes or number spelling.
func FuzzFingerprintIsSameRequest(f *testing.F) {
	for i, s := range hostileBodies {
		f.Add([]byte(s), []byte(hostileBodies[(i+1)%len(hostileBodies)]))
		f.Add([]byte(s), []byte(s))
	}
	f.Add([]byte(`{"b":1,"a":"\u00e9"}`), []byte(" {\"a\" : \"é\", \"b\" : 1.0 } "))
	f.Add([]byte(`{"a":"\ud800"}`), []byte(`{"a":"\udc00"}`))
	f.Add([]byte(`{"a":"\ufffd"}`), []byte(`{"a":"\ud800"}`))
	f.Add([]byte(`{"a":1,"a":2}`), []byte(`{"a":2}`))
	f.Add([]byte(`{"a":-0}`), []byte(`{"a":0}`))
	f.Add([]byte(`{"a":1e400}`), []byte(`{"a":1e401}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		fa, errA := fingerprint(http.MethodPost, "/v1/usage-events", a)
		fb, errB := fingerprint(http.MethodPost, "/v1/usage-events", b)
		if errA != nil || errB != nil {
			return
		}
		if same := jsonvalue.Same(t, a, b); same != bytes.Equal(fa, fb) {
			t.Fatalf("same JSON value %v, same fingerprint %v:\n%q\n%q", same, !same, a, b)
		}
	})
}

// FuzzParseEvent: the body parser never panics, refuses with 400 or 422
// only, and what it accepts is within the documented bounds.
func FuzzParseEvent(f *testing.F) {
	for _, s := range hostileBodies {
		f.Add([]byte(s))
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, body []byte) {
		ev, err := parseEvent(body, now)
		if err != nil {
			var e *overage.Error
			if !errors.As(err, &e) || (e.Code != overage.EMALFORMED && e.Code != overage.EINVALID) {
				t.Fatalf("%q refused with %v, want a 400 or 422 error", body, err)
			}
			return
		}
		for name, n := range map[string]int64{"input_tokens": ev.InputTokens, "output_tokens": ev.OutputTokens} {
			if n < 0 || n > maxTokens {
				t.Fatalf("%q: %s = %d accepted", body, name, n)
			}
		}
		if ev.InputTokens+ev.OutputTokens == 0 {
			t.Fatalf("%q: an event of zero tokens accepted", body)
		}
		if ev.UserID == "" || len(ev.UserID) > maxTextLen || ev.ModelID == "" || len(ev.ModelID) > maxTextLen {
			t.Fatalf("%q: user_id %q or model_id %q out of bounds", body, ev.UserID, ev.ModelID)
		}
		if ev.Timestamp.After(now.Add(maxFutureSkew)) || ev.Timestamp.Before(now.Add(-maxEventAge)) {
			t.Fatalf("%q: timestamp %s out of bounds", body, ev.Timestamp)
		}
	})
}

// FuzzIdempotencyKey: the key parser never panics, accepts only 1-255
// printable ASCII characters, and the bare and the structured-field form of
// an accepted key name the same key.
func FuzzIdempotencyKey(f *testing.F) {
	for _, s := range []string{"k", `"k"`, `"a\"b\\c"`, `"unterminated`, `"bad\escape"`, "\x00", "é", " padded ", `""`, "\"\"\"", string(make([]byte, 256))} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := parseIdempotencyKey(http.Header{"Idempotency-Key": {v}})
		if err != nil {
			var e *overage.Error
			if !errors.As(err, &e) || e.Code != overage.EMALFORMED {
				t.Fatalf("%q refused with %v, want a 400 error", v, err)
			}
			return
		}
		if len(key) == 0 || len(key) > maxKeyLen {
			t.Fatalf("%q: key of %d bytes accepted", v, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("%q: key %q holds byte %#x", v, key, key[i])
			}
		}
		quoted := strconv.Quote(key) // printable ASCII: only \" and \\ escapes
		if again, err := parseIdempotencyKey(http.Header{"Idempotency-Key": {quoted}}); err != nil || again != key {
			t.Fatalf("%q: key %q sent as %s parses as %q, %v", v, key, quoted, again, err)
		}
	})
}
