package fastjson

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/overage-billing/overage/internal/testkit/jsonvalue"
)

// hostileBodies are the seeds of FuzzCanonicalJSON: what no honest client
// sends (ingest's body targets start from the same list).
var hostileBodies = []string{
	`{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"input_tokens":3}`,
	`{"user_id":"u","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"user_id":"\ud800","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"user_id":"\udc00\ud800","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"user_id":"\ud83d\ude00","model_id":"m","input_tokens":1,"output_tokens":2}`,
	"{\"user_id\":\"\xff\xfe\",\"model_id\":\"m\",\"input_tokens\":1,\"output_tokens\":2}",
	`{"user_id":"\u0000","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"user_id":"u","model_id":"m","input_tokens":-0,"output_tokens":2}`,
	`{"user_id":"u","model_id":"m","input_tokens":1e400,"output_tokens":2}`,
	`{"user_id":"u","model_id":"m","input_tokens":99999999999999999999999,"output_tokens":2}`,
	`{"user_id":"u","model_id":"m","input_tokens":1099511627776,"output_tokens":1.0}`,
	`{"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
	`{"a":{"b":{},"b":1}}`,
	`{"\u0061":1,"a":2}`,
	`[-0, 0, 1E2, 100, 1e-7, 5e-324, 1.7976931348623157e308]`,
	`{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"timestamp":"2026-11-30T10:00:00.123456789+14:00"}`,
	`{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"tenant_id":"not-a-uuid"}`,
	`{} {}`,
	`null`,
	``,
}

// FuzzCanonicalJSON: every input either fails cleanly or yields a canonical
// form that is valid JSON, is its own canonical form, and means the same
// JSON value as the input.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range hostileBodies {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		canon, err := Canonical(data)
		// The one-pass canonicaliser answers only what the decoder path
		// answers the same way, byte for byte.
		if fast, ok := canonicalOnePass(data); ok {
			ref, refErr := canonicalViaDecoder(data)
			if refErr != nil || !bytes.Equal(fast, ref) {
				t.Fatalf("one pass gives %q for %q, the decoder path %q, %v", fast, data, ref, refErr)
			}
		}
		if err != nil {
			return
		}
		if !utf8.Valid(data) {
			t.Fatalf("invalid UTF-8 accepted: %q", data)
		}
		if !json.Valid(canon) {
			t.Fatalf("canonical form of %q is not JSON: %q", data, canon)
		}
		again, err := Canonical(canon)
		if err != nil || !bytes.Equal(again, canon) {
			t.Fatalf("canonical form %q is not its own canonical form: %q, %v", canon, again, err)
		}
		if !jsonvalue.Same(t, data, canon) {
			t.Fatalf("canonical form %q means something else than %q", canon, data)
		}
	})
}
