package ingest

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadAllIsIOReadAll: the body read into a buffer of the declared
// length is io.ReadAll's, whatever the declared length, and the limit's
// error comes through.
func TestReadAllIsIOReadAll(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("0123456789", 1000)
	for _, declared := range []int64{-1, 0, 1, 511, 9999, 10000, 10001, 20000} {
		got, err := readAll(iotest.OneByteReader(strings.NewReader(body)), declared, 1<<20)
		if err != nil || string(got) != body {
			t.Fatalf("declared %d: %d bytes, %v", declared, len(got), err)
		}
		got, err = readAll(iotest.HalfReader(strings.NewReader(body)), declared, 1<<20)
		if err != nil || string(got) != body {
			t.Fatalf("declared %d, half reads: %d bytes, %v", declared, len(got), err)
		}
	}
	_, err := readAll(http.MaxBytesReader(nil, io.NopCloser(bytes.NewReader([]byte(body))), 100), 100, 100)
	var tooLarge *http.MaxBytesError
	if !errors.As(err, &tooLarge) {
		t.Fatalf("over the limit: %v, want a MaxBytesError", err)
	}
}
