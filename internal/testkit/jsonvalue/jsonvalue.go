// Package jsonvalue compares JSON texts as values, the oracle of the fuzz
// targets of canonical forms and fingerprints.
package jsonvalue

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"testing"
)

// Same reports whether a and b, both valid I-JSON, are the same
// value: numbers compare as IEEE doubles (so -0 is 0 and 1.0 is 1), strings
// by their characters, objects regardless of member order.
func Same(t testing.TB, a, b []byte) bool {
	t.Helper()
	return equalValues(decodeNumbers(t, a), decodeNumbers(t, b))
}

func decodeNumbers(t testing.TB, data []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", data, err)
	}
	return v
}

func equalValues(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		fa, errA := strconv.ParseFloat(string(a), 64)
		fb, errB := strconv.ParseFloat(string(b), 64)
		return errA == nil && errB == nil && !math.IsInf(fa, 0) && fa == fb
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !equalValues(a[i], b[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			if w, ok := b[k]; !ok || !equalValues(v, w) {
				return false
			}
		}
		return true
	default:
		return a == b
	}
}
