package ingest_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
)

// The optional parts of the totals (cached input read and written,
// reasoning) are taken on single events and batches, recorded on the log,
// shown in the answer and on a read, and replayed byte for byte; a part
// larger than its total is 422 naming it, on checkpoints too.
func TestTokenPartsAreRecordedAndChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	body := `{"request_id":"chatcmpl-9","user_id":"u","model_id":"gpt-4o","input_tokens":1200,"output_tokens":350,` +
		`"cache_read_input_tokens":1000,"cache_creation_input_tokens":100,"reasoning_output_tokens":120}`
	first := b.post(t, b.alice.APIKey, "parts", body)
	requireStatus(t, first, http.StatusAccepted)
	m := first.json(t)
	if m["cache_read_input_tokens"] != 1000.0 || m["cache_creation_input_tokens"] != 100.0 || m["reasoning_output_tokens"] != 120.0 {
		t.Fatalf("the answer does not show the parts: %s", first.body)
	}
	var read, write, reasoning int64
	if err := b.pool.QueryRow(ctx, `SELECT cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens
		FROM usage_logs WHERE request_id = 'chatcmpl-9'`).Scan(&read, &write, &reasoning); err != nil || read != 1000 || write != 100 || reasoning != 120 {
		t.Fatalf("recorded parts %d %d %d (%v)", read, write, reasoning, err)
	}
	get := b.do(t, http.MethodGet, "/v1/usage-events/"+m["id"].(string), b.alice.APIKey, "", "")
	if g := get.json(t); g["cache_read_input_tokens"] != 1000.0 || g["reasoning_output_tokens"] != 120.0 {
		t.Fatalf("a read of the log does not show the parts: %s", get.body)
	}
	again := b.post(t, b.alice.APIKey, "parts", body)
	if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
		t.Fatalf("replay differs:\n%s\n%s", first.body, again.body)
	}
	// Absent parts stay absent.
	plain := b.post(t, b.alice.APIKey, "plain", event(5, 5))
	if strings.Contains(string(plain.body), "cache_read") || strings.Contains(string(plain.body), "reasoning") {
		t.Fatalf("parts shown though not sent: %s", plain.body)
	}

	for _, c := range []struct{ body, field string }{
		{`{"user_id":"u","model_id":"m","input_tokens":10,"output_tokens":1,"cache_read_input_tokens":11}`, "cache_read_input_tokens"},
		{`{"user_id":"u","model_id":"m","input_tokens":10,"output_tokens":1,"cache_read_input_tokens":6,"cache_creation_input_tokens":5}`, "cache_creation_input_tokens"},
		{`{"user_id":"u","model_id":"m","input_tokens":10,"output_tokens":1,"reasoning_output_tokens":2}`, "reasoning_output_tokens"},
		{`{"user_id":"u","model_id":"m","input_tokens":10,"output_tokens":1,"reasoning_output_tokens":-1}`, "reasoning_output_tokens"},
		{`{"request_id":"s1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":1,"cache_read_input_tokens":11,"stream":{"sequence":1,"final":false}}`, "cache_read_input_tokens"},
	} {
		r := b.post(t, b.alice.APIKey, "bad-"+c.field+c.body[len(c.body)-20:], c.body)
		if r.status != http.StatusUnprocessableEntity && r.status != http.StatusBadRequest {
			t.Fatalf("%s: %d %s, want 422 naming %s", c.body, r.status, r.body, c.field)
		}
		if !strings.Contains(string(r.body), `"`+c.field+`"`) {
			t.Fatalf("%s: the problem does not name %s: %s", c.body, c.field, r.body)
		}
	}

	r := b.postBatch(t, b.bob.APIKey, "batch-parts", batch(
		`{"request_id":"b1","user_id":"u","model_id":"m","input_tokens":10,"output_tokens":4,"cache_read_input_tokens":7,"reasoning_output_tokens":4}`,
		batchEvent("b2", 3, 3)))
	requireStatus(t, r, http.StatusAccepted)
	if n := b.count(t, `SELECT count(*) FROM usage_logs WHERE request_id = 'b1' AND cache_read_input_tokens = 7 AND reasoning_output_tokens = 4 AND cache_creation_input_tokens IS NULL`); n != 1 {
		t.Fatalf("the batch's parts were not recorded: %s", r.body)
	}
	if n := b.count(t, `SELECT count(*) FROM usage_logs WHERE request_id = 'b2' AND cache_read_input_tokens IS NULL AND reasoning_output_tokens IS NULL`); n != 1 {
		t.Fatal("an event without parts got some")
	}
}
