package ingest_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
)

// A single event's record holds only its log's id; its replay is rendered
// from the log as it was recorded, byte for byte the first answer, also
// after the log was reported and billed (which changes the log).
func TestCompactRecordReplaysTheFirstAnswerByteForByte(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	type sent struct {
		apiKey, key, body string
		first             response
	}
	bodies := []struct{ apiKey, body string }{
		{b.alice.APIKey, event(7, 3)},
		{b.alice.APIKey, `{"request_id":"chatcmpl-1","user_id":"ü \"quoted\" \u2028","model_id":"gpt-4o","input_tokens":1,"output_tokens":0,"timestamp":"2026-12-01T08:00:00.123456789Z"}`},
		{b.capped.APIKey, event(900, 100)}, // inside the allowance: not billable
		{b.capped.APIKey, event(300, 450)}, // crosses it: part billable
		{b.capped.APIKey, event(10, 10)},   // above it
		{b.bob.APIKey, `{"user_id":"u","model_id":"m","input_tokens":0,"output_tokens":5}`},
	}
	var all []sent
	for i, s := range bodies {
		key := fmt.Sprintf("compact-%d", i)
		r := b.post(t, s.apiKey, key, s.body)
		requireStatus(t, r, http.StatusAccepted)
		all = append(all, sent{s.apiKey, key, s.body, r})
	}
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key LIKE 'compact-%' AND length(response_body) = 0 AND usage_log_id IS NOT NULL`); n != len(all) {
		t.Fatalf("%d of %d single events' records are compact", n, len(all))
	}
	// Reported and billed since: the log is not what it was.
	if _, err := b.pool.Exec(ctx, `UPDATE usage_logs SET billing_status = 'billed', billed_at = now(), first_attempt_at = now(),
		input_accepted_at = now(), output_accepted_at = now(), input_report_lead = id, output_report_lead = id, updated_at = now()
		WHERE billing_status = 'pending'`); err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		again := b.post(t, s.apiKey, s.key, s.body)
		requireStatus(t, again, http.StatusAccepted)
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, s.first.body) {
			t.Fatalf("replay of %s differs from the first answer:\nfirst  %s\nreplay %s", s.key, s.first.body, again.body)
		}
		if reused := b.post(t, s.apiKey, s.key, event(1, 1)); reused.status != http.StatusConflict {
			t.Fatalf("key %s with another body: %d, want 409", s.key, reused.status)
		}
	}
}

// A batch that recorded only new logs is stored as their ids and replayed
// byte for byte after they were billed; one that answered a duplicate
// (an earlier log, as it was then) is stored whole.
func TestCompactBatchRecordReplaysTheFirstAnswerByteForByte(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	fresh := batch(batchEvent("b-1", 5, 5), `{"request_id":"b-2","user_id":"ü","model_id":"m","input_tokens":900,"output_tokens":0,"cache_read_input_tokens":800}`, batchEvent("b-3", 0, 7))
	first := b.postBatch(t, b.capped.APIKey, "batch-new", fresh)
	requireStatus(t, first, http.StatusAccepted)
	withDup := batch(batchEvent("b-1", 5, 5), batchEvent("b-4", 1, 1))
	dup := b.postBatch(t, b.capped.APIKey, "batch-dup", withDup)
	requireStatus(t, dup, http.StatusAccepted)
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'batch-new' AND get_byte(response_body, 0) = 0 AND length(response_body) = 1 + 16 * 3`); n != 1 {
		t.Fatal("an all-new batch's record does not hold just its three log ids")
	}
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'batch-dup' AND get_byte(response_body, 0) = ascii('{')`); n != 1 {
		t.Fatal("a batch with a duplicate is not stored whole")
	}
	if _, err := b.pool.Exec(ctx, `UPDATE usage_logs SET billing_status = 'billed', billed_at = now(), first_attempt_at = now(),
		input_accepted_at = now(), output_accepted_at = now(), input_report_lead = id, output_report_lead = id
		WHERE billing_status = 'pending'`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key, body string
		first     response
	}{{"batch-new", fresh, first}, {"batch-dup", withDup, dup}} {
		again := b.postBatch(t, b.capped.APIKey, c.key, c.body)
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, c.first.body) {
			t.Fatalf("replay of %s differs from the first answer:\nfirst  %s\nreplay %s", c.key, c.first.body, again.body)
		}
	}
}
