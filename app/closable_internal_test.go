package app

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// River UI's log writes through until the server's Run returns, then
// nothing: its queries may outlive the context and log after it.
func TestClosableHandlerDropsRecordsAfterClose(t *testing.T) {
	var buf bytes.Buffer
	h := newClosableHandler(slog.NewTextHandler(&buf, nil))
	l := slog.New(h).With("component", "riverui")
	l.Info("before")
	h.close()
	l.Error("after")
	if out := buf.String(); !strings.Contains(out, "before") || strings.Contains(out, "after") {
		t.Fatalf("log = %q, want the record before close only", out)
	}
}
