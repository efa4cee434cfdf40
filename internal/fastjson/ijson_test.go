package fastjson

import "testing"

// Bodies Go's decoder would silently reshape are refused, so two different
// requests never share a fingerprint: the later duplicate key wins, and
// invalid UTF-8 and lone surrogates become U+FFFD.
func TestCanonicalJSONRefusesWhatIJSONForbids(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"a":1,"a":2}`,
		`{"a":1,"\u0061":1}`,
		`{"x":{"a":{},"a":[]}}`,
		`[{"b":1},{"a":1,"b":2,"a":3}]`,
		`{"a":"\ud800"}`,
		`{"a":"\udc00"}`,
		`{"a":"\ud800\u0041"}`,
		`{"a":"\ud800\ud800"}`,
		"{\"a\":\"\xff\"}",
		"{\"a\":\"\xed\xa0\x80\"}", // a surrogate encoded in UTF-8
		`{"a":1e400}`,
	} {
		if got, err := Canonical([]byte(in)); err == nil {
			t.Errorf("Canonical(%q) = %s, want an error", in, got)
		}
	}
	for _, in := range []string{
		`{"a":{"a":1},"b":{"a":2}}`,
		`[{"a":1},{"a":2}]`,
		`{"a":"\ud83d\ude00\\u0000\\ud800"}`, // a pair, then escaped backslashes
		`{"a":[],"b":{},"c":[{}]}`,
	} {
		if _, err := Canonical([]byte(in)); err != nil {
			t.Errorf("Canonical(%q): %v", in, err)
		}
	}
}

// The bodies honest clients send take the one-pass canonicaliser and get
// what the decoder path gives; what I-JSON forbids is left to the decoder
// path, which words the refusal.
func TestCanonicalOnePassAgreesWithTheDecoder(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"request_id":"r-1"}`,
		` {"events":[{"b":1,"a":"x"},{"a":[true,false,null,-0,1E2,1.5e-7,0.1]}]} `,
		`{"\ue000":1,"\ud83d\ude00":2,"a\u0000\/\"\\\b\f\n\r\t\u001f":"\u00e9é😀"}`,
		`{"a":{"a":1},"b":{"a":2}}`,
		`[{},[],""]`,
	} {
		fast, ok := canonicalOnePass([]byte(in))
		if !ok {
			t.Errorf("canonicalOnePass(%q) declined", in)
			continue
		}
		ref, err := canonicalViaDecoder([]byte(in))
		if err != nil || string(fast) != string(ref) {
			t.Errorf("canonicalOnePass(%q) = %s, the decoder path %s, %v", in, fast, ref, err)
		}
	}
	for _, in := range []string{
		`{"a":1,"\u0061":2}`, `{"a":"\ud800"}`, `{"a":"\ud800\u0041"}`, "{\"a\":\"\xff\"}",
		`{"a":1e400}`, `{} {}`, `{"a":01}`, "{\"a\":\"\t\"}", `{"a":"\x"}`, ``,
	} {
		if got, ok := canonicalOnePass([]byte(in)); ok {
			t.Errorf("canonicalOnePass(%q) = %s, want it left to the decoder path", in, got)
		}
	}
}
