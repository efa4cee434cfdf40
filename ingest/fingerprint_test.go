package ingest

import (
	"net/http"
	"testing"
)

func TestFingerprintCoversMethodPathAndBody(t *testing.T) {
	t.Parallel()
	fp := func(path, body string) string {
		t.Helper()
		b, err := fingerprint("POST", path, []byte(body))
		if err != nil || len(b) == 0 {
			t.Fatalf("fingerprint(%s, %s) = %x, %v", path, body, b, err)
		}
		return string(b)
	}
	a := fp("/v1/usage-events", `{"a":1}`)
	same := fp("/v1/usage-events", `{ "a" : 1 }`)
	otherBody := fp("/v1/usage-events", `{"a":2}`)
	otherPath := fp("/v1/usage-events/batch", `{"a":1}`)
	if a != same {
		t.Error("whitespace changed the fingerprint")
	}
	if a == otherBody || a == otherPath {
		t.Error("a different body or path gave the same fingerprint")
	}
}

func TestParseIdempotencyKey(t *testing.T) {
	t.Parallel()
	ok := map[string]string{
		`abc`:        "abc",
		`"abc"`:      "abc",
		` abc `:      "abc",
		`"a\"b\\c"`:  `a"b\c`,
		`has space`:  "has space",
		`"with sp"`:  "with sp",
		`x"y`:        `x"y`,
		`key:1/2?=&`: `key:1/2?=&`,
	}
	for in, want := range ok {
		h := http.Header{}
		h.Set("Idempotency-Key", in)
		got, err := parseIdempotencyKey(h)
		if err != nil || got != want {
			t.Errorf("parse(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{``, `""`, `"abc`, `"a"b"`, `"a\b"`, "tab\there", "é"} {
		h := http.Header{}
		h.Set("Idempotency-Key", in)
		if got, err := parseIdempotencyKey(h); err == nil {
			t.Errorf("parse(%q) = %q, want an error", in, got)
		}
	}
	h := http.Header{}
	h.Add("Idempotency-Key", "a")
	h.Add("Idempotency-Key", "b")
	if _, err := parseIdempotencyKey(h); err == nil {
		t.Error("two Idempotency-Key headers accepted")
	}
}

// Lone surrogates are refused, so two different ones can never share a
// fingerprint (Go's decoder would turn both into U+FFFD).
func TestFingerprintRefusesLoneSurrogates(t *testing.T) {
	t.Parallel()
	for _, in := range []string{`{"a":"\ud800"}`, `{"a":"\udc00"}`} {
		if fp, err := fingerprint(http.MethodPost, "/v1/usage-events", []byte(in)); err == nil {
			t.Fatalf("fingerprint(%s) = %x, want it refused", in, fp)
		}
	}
}
