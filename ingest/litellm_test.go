package ingest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// litellmDelivery is ingest/testdata/litellm_payloads.json — three
// StandardLoggingPayload objects as LiteLLM's generic logging callback
// posts them (two successful calls, one failed) — with the times moved to
// around now and the payloads picked by index.
func litellmDelivery(t *testing.T, pick ...int) string {
	t.Helper()
	raw, err := os.ReadFile("testdata/litellm_payloads.json")
	if err != nil {
		t.Fatal(err)
	}
	var all []map[string]any
	if err := json.Unmarshal(raw, &all); err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().Add(-time.Minute).UnixMicro()) / 1e6
	var out []map[string]any
	for _, i := range pick {
		p := all[i]
		p["startTime"], p["endTime"], p["completionStartTime"] = now-1.5, now, now-1
		out = append(out, p)
	}
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (b *bundle) postLiteLLM(t *testing.T, apiKey, body string) response {
	t.Helper()
	return b.do(t, http.MethodPost, "/v1/integrations/litellm", apiKey, "", body)
}

func (b *bundle) logsOf(t *testing.T, requestID string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM usage_logs WHERE request_id = $1", requestID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestLiteLLMRecordsSuccessfulCallsAsABatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := litellmDelivery(t, 0, 1, 2)
	r := b.postLiteLLM(t, b.alice.APIKey, body)
	if r.status != http.StatusAccepted || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("status %d %v: %s", r.status, r.header, r.body)
	}
	m := r.json(t)
	evs := batchEvents(t, r)
	if m["created"] != 2.0 || m["duplicates"] != 0.0 || len(evs) != 2 {
		t.Fatalf("answer %s, want the two successful calls created", r.body)
	}
	want := []struct {
		rid, user, model string
		in, out          float64
	}{
		{"chatcmpl-litellm-1", "u_42", "gpt-4o", 1200, 350},
		// No end_user: the LiteLLM key's user.
		{"msg_litellm_2", "key-user-9", "claude-sonnet-4-20250514", 2125, 150},
	}
	for i, w := range want {
		e := evs[i]
		if e["index"] != float64(i) || e["request_id"] != w.rid || e["user_id"] != w.user || e["model_id"] != w.model ||
			e["input_tokens"] != w.in || e["output_tokens"] != w.out || e["billing_status"] != "pending" || e["duplicate"] != false {
			t.Fatalf("event %d = %v, want %+v", i, e, w)
		}
		ts, err := time.Parse(time.RFC3339Nano, e["timestamp"].(string))
		if err != nil || time.Since(ts) < 30*time.Second || time.Since(ts) > 5*time.Minute {
			t.Fatalf("event %d timestamp %v (%v), want the payload's endTime, a minute ago", i, e["timestamp"], err)
		}
	}
	if n := b.logsOf(t, "chatcmpl-litellm-failed"); n != 0 {
		t.Fatalf("the failed call has %d usage logs", n)
	}
}

// LiteLLM retries a delivery that got no answer with the same list: the
// key is derived from the payloads, so the retry is a replay.
func TestLiteLLMRedeliveryIsReplayedAndRegroupedBillsNothingTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := litellmDelivery(t, 0, 1, 2)
	first := b.postLiteLLM(t, b.alice.APIKey, body)
	again := b.postLiteLLM(t, b.alice.APIKey, body)
	if first.status != http.StatusAccepted || again.status != http.StatusAccepted || again.header.Get("Idempotent-Replayed") != "true" ||
		string(again.body) != string(first.body) {
		t.Fatalf("redelivery: %d %v %s, want the first answer replayed", again.status, again.header, again.body)
	}
	// A call delivered again in another list (LiteLLM rebuilt its batch):
	// another key, and the call answered as a duplicate of its first log.
	regrouped := b.postLiteLLM(t, b.alice.APIKey, litellmDelivery(t, 2))
	if regrouped.status != http.StatusAccepted || regrouped.json(t)["duplicates"] != 1.0 || regrouped.json(t)["created"] != 0.0 {
		t.Fatalf("a call delivered again in another list: %d %s, want it answered as a duplicate", regrouped.status, regrouped.body)
	}
	for _, rid := range []string{"chatcmpl-litellm-1", "msg_litellm_2"} {
		if n := b.logsOf(t, rid); n != 1 {
			t.Fatalf("%s has %d usage logs, want 1", rid, n)
		}
	}
	// Another tenant's LiteLLM sending the same ids records its own.
	if r := b.postLiteLLM(t, b.bob.APIKey, body); r.status != http.StatusAccepted || r.json(t)["created"] != 2.0 {
		t.Fatalf("bob: %d %s", r.status, r.body)
	}
}

// log_format ndjson: one payload per line.
func TestLiteLLMNDJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ps []json.RawMessage
	if err := json.Unmarshal([]byte(litellmDelivery(t, 0, 1, 2)), &ps); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, p := range ps {
		lines = append(lines, string(p))
	}
	r := b.postLiteLLM(t, b.alice.APIKey, strings.Join(lines, "\n")+"\n")
	if r.status != http.StatusAccepted || r.json(t)["created"] != 2.0 {
		t.Fatalf("ndjson: %d %s", r.status, r.body)
	}
}

func TestLiteLLMRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Only failed calls: nothing to record, and nothing is.
	if r := b.postLiteLLM(t, b.alice.APIKey, litellmDelivery(t, 1)); r.status != http.StatusOK || string(r.body) != `{"events":[],"created":0,"duplicates":0}` {
		t.Fatalf("only failures: %d %s", r.status, r.body)
	}
	if r := b.postLiteLLM(t, "", litellmDelivery(t, 0)); r.status != http.StatusUnauthorized {
		t.Fatalf("no key: %d %s", r.status, r.body)
	}
	if r := b.postLiteLLM(t, b.alice.APIKey, `[{"id":`); r.status != http.StatusBadRequest {
		t.Fatalf("malformed: %d %s", r.status, r.body)
	}
	// A successful call without a model: 422 naming the payload's field,
	// by its index in the delivery, and nothing stored.
	var ps []map[string]any
	if err := json.Unmarshal([]byte(litellmDelivery(t, 1, 0)), &ps); err != nil {
		t.Fatal(err)
	}
	ps[1]["model"] = ""
	bad, _ := json.Marshal(ps)
	r := b.postLiteLLM(t, b.alice.APIKey, string(bad))
	var p struct {
		Errors []struct{ Field string } `json:"errors"`
	}
	if err := json.Unmarshal(r.body, &p); err != nil || r.status != http.StatusUnprocessableEntity || len(p.Errors) != 1 || p.Errors[0].Field != "[1].model" {
		t.Fatalf("no model: %d %s", r.status, r.body)
	}
	if n := b.logsOf(t, "chatcmpl-litellm-1"); n != 0 {
		t.Fatalf("a refused delivery stored %d logs", n)
	}
}

// The cached and reasoning counts of LiteLLM's usage object become the
// event's parts — OpenAI's shape (prompt_tokens_details.cached_tokens,
// completion_tokens_details.reasoning_tokens) and Anthropic's
// (cache_read_input_tokens, cache_creation_input_tokens) — and a count
// that does not fit in its total is left out, not refused.
func TestLiteLLMUsageObjectPartsAreRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var payloads []map[string]any
	if err := json.Unmarshal([]byte(litellmDelivery(t, 0, 2)), &payloads); err != nil {
		t.Fatal(err)
	}
	usage := func(p map[string]any, u map[string]any) {
		md, _ := p["metadata"].(map[string]any)
		if md == nil {
			md = map[string]any{}
			p["metadata"] = md
		}
		md["usage_object"] = u
	}
	usage(payloads[0], map[string]any{"prompt_tokens_details": map[string]any{"cached_tokens": 1024},
		"completion_tokens_details": map[string]any{"reasoning_tokens": 100}})
	usage(payloads[1], map[string]any{"cache_read_input_tokens": 2000, "cache_creation_input_tokens": 100,
		"completion_tokens_details": map[string]any{"reasoning_tokens": 999}}) // 999 > 150 output: left out
	body, err := json.Marshal(payloads)
	if err != nil {
		t.Fatal(err)
	}
	r := b.postLiteLLM(t, b.alice.APIKey, string(body))
	requireStatus(t, r, http.StatusAccepted)
	evs := batchEvents(t, r)
	if len(evs) != 2 {
		t.Fatalf("answer %s", r.body)
	}
	for i, want := range []map[string]any{
		{"cache_read_input_tokens": 1024.0, "reasoning_output_tokens": 100.0},
		{"cache_read_input_tokens": 2000.0, "cache_creation_input_tokens": 100.0},
	} {
		for _, k := range []string{"cache_read_input_tokens", "cache_creation_input_tokens", "reasoning_output_tokens"} {
			if evs[i][k] != want[k] {
				t.Fatalf("event %d %s = %v, want %v: %v", i, k, evs[i][k], want[k], evs[i])
			}
		}
	}
}
