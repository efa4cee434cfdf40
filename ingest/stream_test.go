package ingest_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/billingtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/worktest"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/workers"
)

func checkpoint(rid string, seq int, final bool, in, out int) string {
	return fmt.Sprintf(`{"request_id":%q,"user_id":"u_42","model_id":"gpt-4o","input_tokens":%d,"output_tokens":%d,"stream":{"sequence":%d,"final":%t}}`,
		rid, in, out, seq, final)
}

func ckKey(rid string, seq int) string { return fmt.Sprintf("%s:%d", rid, seq) }

// streamTotals reads GET /v1/usage-events?request_id= and checks that the
// stream's logs add up to its totals.
func (b *bundle) streamTotals(t *testing.T, apiKey, rid string) (in, out float64, logs []any) {
	t.Helper()
	r := b.do(t, http.MethodGet, "/v1/usage-events?request_id="+url.QueryEscape(rid), apiKey, "", "")
	requireStatus(t, r, http.StatusOK)
	m := r.json(t)
	st := m["stream"].(map[string]any)
	logs = m["usage_events"].([]any)
	var sumIn, sumOut float64
	for _, l := range logs {
		l := l.(map[string]any)
		sumIn += l["input_tokens"].(float64)
		sumOut += l["output_tokens"].(float64)
	}
	if sumIn != st["input_tokens"] || sumOut != st["output_tokens"] {
		t.Fatalf("the stream's logs add up to %v/%v, its totals are %v/%v: %s", sumIn, sumOut, st["input_tokens"], st["output_tokens"], r.body)
	}
	return sumIn, sumOut, logs
}

// A stream's checkpoints: each newer one records the increase; an older or
// repeated one is stale; a non-final one cannot lower a total; the final
// one may (a correction); nothing after it; a plain event with the
// stream's request_id is a duplicate.
func TestStreamCheckpointsRecordOnlyIncreases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := b.alice.APIKey
	rid := "chatcmpl-stream-1"
	r := b.post(t, key, ckKey(rid, 0), checkpoint(rid, 0, false, 10, 0))
	requireStatus(t, r, http.StatusAccepted)
	if m := r.json(t); m["input_tokens"] != float64(10) || m["request_id"] != rid || m["stale"] != false ||
		m["stream"].(map[string]any)["input_tokens"] != float64(10) {
		t.Fatalf("first checkpoint: %s", r.body)
	}
	r = b.post(t, key, ckKey(rid, 1), checkpoint(rid, 1, false, 30, 5))
	requireStatus(t, r, http.StatusAccepted)
	if m := r.json(t); m["input_tokens"] != float64(20) || m["output_tokens"] != float64(5) || m["request_id"] != nil {
		t.Fatalf("second checkpoint records the increase 20/5: %s", r.body)
	}
	// The same sequence under another key, and an older one: stale.
	for _, c := range []struct {
		key  string
		body string
	}{{"again-1", checkpoint(rid, 1, false, 30, 5)}, {"late-0", checkpoint(rid, 0, false, 10, 0)}} {
		r = b.post(t, key, c.key, c.body)
		requireStatus(t, r, http.StatusOK)
		if m := r.json(t); m["stale"] != true || m["id"] != nil || m["stream"].(map[string]any)["input_tokens"] != float64(30) {
			t.Fatalf("stale checkpoint: %s", r.body)
		}
	}
	requireProblem(t, b.post(t, key, ckKey(rid, 2), checkpoint(rid, 2, false, 25, 5)), http.StatusUnprocessableEntity, "validation-failed")
	// The final checkpoint lowers input (a correction) and raises output.
	r = b.post(t, key, ckKey(rid, 3), checkpoint(rid, 3, true, 25, 8))
	requireStatus(t, r, http.StatusAccepted)
	m := r.json(t)
	c, _ := m["correction"].(map[string]any)
	if m["output_tokens"] != float64(3) || m["input_tokens"] != float64(0) || c == nil || c["kind"] != "correction" || c["input_tokens"] != float64(-5) ||
		c["corrected_by"] != b.alice.APIKeyID.String() {
		t.Fatalf("final checkpoint: %s (the correction by the stream's key %s)", r.body, b.alice.APIKeyID)
	}
	requireProblem(t, b.post(t, key, ckKey(rid, 4), checkpoint(rid, 4, false, 40, 8)), http.StatusConflict, "stream-closed")
	r = b.post(t, key, "plain", event(25, 8)[:len(event(25, 8))-1]+`,"request_id":"`+rid+`"}`)
	requireStatus(t, r, http.StatusOK)
	if r.json(t)["duplicate"] != true {
		t.Fatalf("plain event with the stream's request_id: %s", r.body)
	}
	in, out, logs := b.streamTotals(t, key, rid)
	if in != 25 || out != 8 || len(logs) != 4 {
		t.Fatalf("stream totals %v/%v in %d logs, want 25/8 in 4", in, out, len(logs))
	}
	// Another tenant sees nothing of it.
	requireProblem(t, b.do(t, http.MethodGet, "/v1/usage-events?request_id="+rid, b.bob.APIKey, "", ""), http.StatusNotFound, "not-found")
}

// A checkpoint whose answer was lost is retried under its key: the stored
// answer, nothing recorded twice. Checkpoints arriving out of order: the
// older is stale, nothing is lost.
func TestStreamLostAnswerAndOutOfOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := b.alice.APIKey
	rid := "chatcmpl-stream-2"
	first := b.post(t, key, ckKey(rid, 2), checkpoint(rid, 2, false, 50, 10))
	requireStatus(t, first, http.StatusAccepted)
	again := b.post(t, key, ckKey(rid, 2), checkpoint(rid, 2, false, 50, 10))
	if again.status != http.StatusAccepted || string(again.body) != string(first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of a lost answer: %d %s", again.status, again.body)
	}
	late := b.post(t, key, ckKey(rid, 1), checkpoint(rid, 1, false, 30, 5))
	requireStatus(t, late, http.StatusOK)
	if late.json(t)["stale"] != true {
		t.Fatalf("out-of-order checkpoint: %s", late.body)
	}
	if in, out, logs := b.streamTotals(t, key, rid); in != 50 || out != 10 || len(logs) != 1 {
		t.Fatalf("stream totals %v/%v in %d logs, want 50/10 in 1", in, out, len(logs))
	}
}

// Checkpoints of one stream racing, each sent twice, in random order: the
// stream's row lock referees, so the logs add up to the highest
// checkpoint's totals exactly, and so does the period's total.
func TestConcurrentCheckpointsNeverDoubleCount(t *testing.T) {
	t.Parallel()
	b := setupUnlimited(t)
	rid := "chatcmpl-race"
	const n = 24
	order := rand.Perm(2 * n)
	var wg sync.WaitGroup
	errs := make(chan string, 2*n)
	for _, o := range order {
		seq := o % n
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := b.post(t, b.capped.APIKey, ckKey(rid, seq), checkpoint(rid, seq, false, 100*(seq+1), 7*(seq+1)))
			if r.status != http.StatusAccepted && r.status != http.StatusOK && r.status != http.StatusConflict {
				errs <- fmt.Sprintf("checkpoint %d: %d %s", seq, r.status, r.body)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	in, out, _ := b.streamTotals(t, b.capped.APIKey, rid)
	if in != 100*n || out != 7*n {
		t.Fatalf("stream totals %v/%v, want %d/%d", in, out, 100*n, 7*n)
	}
	var total, overIn int64
	if err := b.pool.QueryRow(context.Background(), `SELECT (SELECT sum(input_tokens) FROM allowance_usage WHERE tenant_id = $1),
		(SELECT sum(coalesce(overage_input_tokens, input_tokens)) FROM usage_logs WHERE tenant_id = $1)`, b.capped.ID).Scan(&total, &overIn); err != nil {
		t.Fatal(err)
	}
	if total != 100*n || overIn != 100*n-1000 {
		t.Fatalf("period total %d and overage %d, want %d and %d (allowance 1,000)", total, overIn, 100*n, 100*n-1000)
	}
}

// A final checkpoint lower than the last one gives back exactly the overage
// the difference was billed, and Stripe's net total is the period's
// overage.
func TestFinalCheckpointLowerThanTheLastIsRefunded(t *testing.T) {
	t.Parallel()
	const allowance = 100
	w := worktest.New(t, worktest.Options{Tenants: []tenants.CreateParams{{StripeCustomerID: "cus_stream", IncludedInputTokens: allowance}}})
	tenant := w.Tenants["cus_stream"].ID
	w.Start(t, workers.Config{})
	rid := "chatcmpl-final"
	send := func(seq int, final bool, in int64) error {
		t.Helper()
		ev := &ingest.Event{RequestID: &rid, Timestamp: time.Now().Add(-time.Minute).UTC().Truncate(time.Microsecond), UserID: "u", ModelID: "m",
			InputTokens: in, Stream: &ingest.Checkpoint{Sequence: int64(seq), Final: final}}
		k := ckKey(rid, seq)
		_, err := w.Ingest.Checkpoint(context.Background(), ingest.RecordParams{TenantID: tenant, Key: k, Fingerprint: []byte(k), Event: ev})
		return err
	}
	applied := func(want int64) {
		t.Helper()
		key := emulator.AppliedKey{Customer: "cus_stream", EventName: billingtest.InputEvent}
		polltest.Until(t, fmt.Sprintf("Stripe to hold %d", want), 30*time.Second, func() bool {
			var pending int
			if err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM usage_logs WHERE billing_status = 'pending'`).Scan(&pending); err != nil {
				t.Fatal(err)
			}
			return pending == 0 && w.Emu.Applied()[key] == want
		})
		billingtest.RequireStripeMatchesBilled(t, w.Pool, w.Emu)
	}
	for _, c := range []struct {
		seq   int
		final bool
		in    int64
	}{{0, false, 80}, {1, false, 300}} { // 200 over the allowance
		if err := send(c.seq, c.final, c.in); err != nil {
			t.Fatal(err)
		}
	}
	applied(200)
	if err := send(2, true, 150); err != nil { // the provider's count: 50 over
		t.Fatal(err)
	}
	applied(50)
	if err := send(3, true, 120); overage.AsError(err).Type != "stream-closed" {
		t.Fatalf("a checkpoint after the final one: %v", err)
	}
}
