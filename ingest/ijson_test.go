package ingest

import (
	"net/http"
	"testing"
)

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
		if got, err := canonicalJSON([]byte(in)); err == nil {
			t.Errorf("canonicalJSON(%q) = %s, want an error", in, got)
		}
	}
	for _, in := range []string{
		`{"a":{"a":1},"b":{"a":2}}`,
		`[{"a":1},{"a":2}]`,
		`{"a":"\ud83d\ude00\\u0000\\ud800"}`, // a pair, then escaped backslashes
		`{"a":[],"b":{},"c":[{}]}`,
	} {
		if _, err := canonicalJSON([]byte(in)); err != nil {
			t.Errorf("canonicalJSON(%q): %v", in, err)
		}
	}
	a, errA := fingerprint(http.MethodPost, "/v1/usage-events", []byte(`{"a":"\ud800"}`))
	b, errB := fingerprint(http.MethodPost, "/v1/usage-events", []byte(`{"a":"\udc00"}`))
	if errA == nil && errB == nil && string(a) == string(b) {
		t.Fatal("two different lone surrogates share a fingerprint")
	}
}
