package fastjson

import (
	"fmt"
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
		got, err := Canonical([]byte(c.in))
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if string(got) != c.want {
			t.Errorf("Canonical(%s) = %s, want %s", c.in, got, c.want)
		}
		if ref, err := canonicalViaDecoder([]byte(c.in)); err != nil || string(ref) != c.want {
			t.Errorf("canonicalViaDecoder(%s) = %s, %v; want %s", c.in, ref, err, c.want)
		}
	}
	if _, err := Canonical([]byte(`{} {}`)); err == nil {
		t.Error("trailing data accepted")
	}
}

// benchBatch is a batch of 1,000 events as the ingest bench sends them.
func benchBatch() []byte {
	var sb strings.Builder
	sb.WriteString(`{"events":[`)
	for i := range 1000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"request_id":"req-%d","user_id":"user-%d","model_id":"gpt-4o","input_tokens":%d,"output_tokens":%d,"timestamp":"2026-11-30T10:00:00.123456Z"}`, i, i%7, 100+i, 50+i)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}

// BenchmarkCanonicalBatch: the one-pass canonicaliser against the decoder
// path it replaced, on a batch of 1,000 events (jsontext_test.go adds
// encoding/json/jsontext's Canonicalize under GOEXPERIMENT=jsonv2).
func BenchmarkCanonicalBatch(b *testing.B) {
	body := benchBatch()
	for _, c := range []struct {
		name string
		fn   func([]byte) ([]byte, error)
	}{{"one-pass", Canonical}, {"decoder", canonicalViaDecoder}} {
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
