package ingest

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage"
)

// TestMessagesNameTheirSubjectOnce holds two messages a person reads in a
// problem's detail: each names what it is about, once.
func TestMessagesNameTheirSubjectOnce(t *testing.T) {
	t.Parallel()
	_, err := parseEvent([]byte(`{"user_id":"u","model_id":"m","input_tokens":0,"output_tokens":0}`), time.Now())
	if err == nil || !strings.Contains(err.Error(), "input_tokens is zero, and so is output_tokens") || strings.Contains(err.Error(), "input_tokens input_tokens") {
		t.Errorf("both counts zero: %v", err)
	}
	r := httptest.NewRequest("POST", "/v1/usage-events", strings.NewReader(`{}`))
	r.Header.Set("Content-Type", "text/plain")
	_, _, err = readKeyAndBody(r, 1<<10)
	if e := overage.AsError(err); e.Code != overage.EMALFORMED || !strings.HasPrefix(e.Message, "the Content-Type header must be application/json") {
		t.Errorf("a text/plain body: %v", err)
	}
}
