//go:build goexperiment.jsonv2

package fastjson

import (
	"bytes"
	"encoding/json/jsontext"
	"testing"
)

// jsontextCanonical is RFC 8785 through encoding/json/jsontext (the
// standard library's form of github.com/go-json-experiment/json), which
// refuses duplicate names and invalid UTF-8 by default: the candidate to
// replace Canonical, kept measured here. Run with
//
//	GOEXPERIMENT=jsonv2 go test -run Jsontext -bench CanonicalBatch ./internal/fastjson
func jsontextCanonical(data []byte) ([]byte, error) {
	v := jsontext.Value(bytes.Clone(data))
	if err := v.Canonicalize(); err != nil {
		return nil, err
	}
	return v, nil
}

// TestJsontextAgreesOnTheBatch: both give the same bytes for the bench's
// batch and the canonical test cases, so the benchmark compares like with
// like.
func TestJsontextAgreesOnTheBatch(t *testing.T) {
	t.Parallel()
	body := benchBatch()
	want, err := Canonical(body)
	if err != nil {
		t.Fatal(err)
	}
	got, err := jsontextCanonical(body)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("jsontext: %v, %.200s\nours: %.200s", err, got, want)
	}
}

func BenchmarkCanonicalBatchJsontext(b *testing.B) {
	body := benchBatch()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := jsontextCanonical(body); err != nil {
			b.Fatal(err)
		}
	}
}
