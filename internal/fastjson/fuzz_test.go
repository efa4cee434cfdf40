package fastjson

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/overage-billing/overage/internal/testkit/jsonvalue"
)

// hostileBodies are the seeds of FuzzCanonicalJSON (ingest's body targets
// start from the same list).
var hostileBodies = jsonvalue.HostileBodies

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
