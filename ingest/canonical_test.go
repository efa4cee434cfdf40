package ingest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{`{"b":1, "a":2}`, `{"a":2,"b":1}`},
		{" { \"a\" : [ 1 , 2.50, -0, 1e3 ] } ", `{"a":[1,2.5,0,1000]}`},
		{`{"n":1e21,"m":1e-7,"o":0.000001}`, `{"m":1e-7,"n":1e+21,"o":0.000001}`},
		{`"\u00e9\u2028\/"`, "\"\u00e9\u2028/\""},
		{`"\u001f\n"`, `"\u001f\n"`},
		// Sorted by UTF-16 code units: U+FB33 sorts before U+1F600 (a
		// surrogate pair starting 0xD83D) only in UTF-16, not in UTF-8.
		{`{"\ufb33":2,"😀":1}`, "{\"😀\":1,\"\uFB33\":2}"},
		{`{"a":{"z":null,"y":true}}`, `{"a":{"y":true,"z":null}}`},
		// Integers of up to 15 digits are copied; longer ones are rounded
		// to a float64 as ECMAScript does.
		{`[-0,0,-12,999999999999999,1234567890123456789,10000000000000001]`, `[0,0,-12,999999999999999,1234567890123456800,10000000000000000]`},
		{`{"b":{"d":1,"c":2},"a":[{"f":1,"e":2}]}`, `{"a":[{"e":2,"f":1}],"b":{"c":2,"d":1}}`},
	}
	for _, c := range cases {
		got, err := canonicalJSON([]byte(c.in))
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if string(got) != c.want {
			t.Errorf("canonicalJSON(%s) = %s, want %s", c.in, got, c.want)
		}
		if ref, err := canonicalViaDecoder([]byte(c.in)); err != nil || string(ref) != c.want {
			t.Errorf("canonicalViaDecoder(%s) = %s, %v; want %s", c.in, ref, err, c.want)
		}
	}
	if _, err := canonicalJSON([]byte(`{} {}`)); err == nil {
		t.Error("trailing data accepted")
	}
}

func TestFingerprintCoversMethodPathAndBody(t *testing.T) {
	t.Parallel()
	a, _ := fingerprint("POST", "/v1/usage-events", []byte(`{"a":1}`))
	same, _ := fingerprint("POST", "/v1/usage-events", []byte(`{ "a" : 1 }`))
	otherBody, _ := fingerprint("POST", "/v1/usage-events", []byte(`{"a":2}`))
	otherPath, _ := fingerprint("POST", "/v1/usage-events/batch", []byte(`{"a":1}`))
	if string(a) != string(same) {
		t.Error("whitespace changed the fingerprint")
	}
	if string(a) == string(otherBody) || string(a) == string(otherPath) {
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

// BenchmarkCanonicalBatch: the one-pass canonicaliser against the decoder
// path it replaced, on a batch of 1,000 events as the ingest bench sends.
func BenchmarkCanonicalBatch(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"events":[`)
	for i := range MaxBatchEvents {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"request_id":"req-%d","user_id":"user-%d","model_id":"gpt-4o","input_tokens":%d,"output_tokens":%d,"timestamp":"2026-11-30T10:00:00.123456Z"}`, i, i%7, 100+i, 50+i)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	for _, c := range []struct {
		name string
		fn   func([]byte) ([]byte, error)
	}{{"one-pass", canonicalJSON}, {"decoder", canonicalViaDecoder}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := c.fn(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
