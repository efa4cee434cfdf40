package ingest_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overage-billing/overage/ingest"
)

func (b *bundle) postBatch(t *testing.T, apiKey, idemKey, body string) response {
	t.Helper()
	return b.do(t, http.MethodPost, "/v1/usage-events/batch", apiKey, idemKey, body)
}

// batchEvent is one event of a batch body with request_id rid.
func batchEvent(rid string, in, out int) string {
	return fmt.Sprintf(`{"request_id":%q,"user_id":"u_42","model_id":"gpt-4o","input_tokens":%d,"output_tokens":%d}`, rid, in, out)
}

func batch(events ...string) string { return `{"events":[` + strings.Join(events, ",") + `]}` }

// batchEvents returns the per-event answers of a batch response.
func batchEvents(t *testing.T, r response) []map[string]any {
	t.Helper()
	m := r.json(t)
	raw, ok := m["events"].([]any)
	if !ok {
		t.Fatalf("no events in %s", r.body)
	}
	out := make([]map[string]any, len(raw))
	for i, e := range raw {
		out[i] = e.(map[string]any)
	}
	return out
}

func TestBatchRecordsEveryEventInOneAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.postBatch(t, b.alice.APIKey, "b1", batch(batchEvent("r1", 100, 10), batchEvent("r2", 200, 20), batchEvent("r0", 300, 30)))
	requireStatus(t, r, http.StatusAccepted)
	m := r.json(t)
	if m["created"] != 3.0 || m["duplicates"] != 0.0 {
		t.Fatalf("created/duplicates = %v/%v: %s", m["created"], m["duplicates"], r.body)
	}
	evs := batchEvents(t, r)
	for i, e := range evs {
		want := []string{"r1", "r2", "r0"}[i]
		if e["index"] != float64(i) || e["duplicate"] != false || e["request_id"] != want || e["billing_status"] != "pending" ||
			e["input_tokens"] != float64(100*(i+1)) || e["overage"].(map[string]any)["input_tokens"] != float64(100*(i+1)) {
			t.Fatalf("event %d = %v", i, e)
		}
	}
	// The answer names the logs as they are stored.
	for _, e := range evs {
		g := b.do(t, http.MethodGet, "/v1/usage-events/"+e["id"].(string), b.alice.APIKey, "", "")
		requireStatus(t, g, http.StatusOK)
		if gm := g.json(t); gm["created_at"] != e["created_at"] || gm["timestamp"] != e["timestamp"] || gm["request_id"] != e["request_id"] {
			t.Fatalf("stored log %s differs from the answer %v", g.body, e)
		}
	}
	// A new log keeps updated_at NULL (0068): it would only repeat
	// created_at.
	var fresh int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM usage_logs WHERE updated_at IS NULL`).Scan(&fresh); err != nil || fresh != 3 {
		t.Fatalf("%d of the 3 new logs have updated_at NULL (%v)", fresh, err)
	}
	// One report job per tenant covers every billable log of the batch.
	if b.logs(t) != 3 || b.jobs(t) != 1 || b.records(t) != 1 {
		t.Fatalf("logs/jobs/records = %d/%d/%d, want 3/1/1", b.logs(t), b.jobs(t), b.records(t))
	}
}

func TestBatchReplayKeyReuseAndInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := batch(batchEvent("r1", 1, 1), batchEvent("r2", 2, 2))
	first := b.postBatch(t, b.alice.APIKey, "k", body)
	requireStatus(t, first, http.StatusAccepted)
	// Key order and whitespace do not change the request.
	again := b.postBatch(t, b.alice.APIKey, "k", strings.ReplaceAll(body, ",", " , "))
	requireStatus(t, again, http.StatusAccepted)
	if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(first.body, again.body) {
		t.Fatalf("replay differs or unmarked:\n%s\n%s", first.body, again.body)
	}
	requireProblem(t, b.postBatch(t, b.alice.APIKey, "k", batch(batchEvent("r1", 1, 1))), http.StatusConflict, "idempotency-key-reused")
	// A single event under the batch's key is another request too.
	requireProblem(t, b.post(t, b.alice.APIKey, "k", event(1, 1)), http.StatusConflict, "idempotency-key-reused")
	if b.logs(t) != 2 || b.jobs(t) != 1 {
		t.Fatalf("logs/jobs = %d/%d, want 2/1 (one report job for the batch, none for its replay)", b.logs(t), b.jobs(t))
	}

	// While a batch executes, its key answers 409 in progress.
	inside, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ingest.SetBeforeWrites(b.svc, func(context.Context) error {
		once.Do(func() { close(inside); <-release })
		return nil
	})
	done := make(chan response)
	go func() { done <- b.postBatch(t, b.alice.APIKey, "slow", batch(batchEvent("r3", 1, 1))) }()
	<-inside
	ip := b.postBatch(t, b.alice.APIKey, "slow", batch(batchEvent("r3", 1, 1)))
	requireProblem(t, ip, http.StatusConflict, "idempotency-key-in-progress")
	if ip.header.Get("Retry-After") == "" {
		t.Fatal("409 in progress without Retry-After")
	}
	close(release)
	requireStatus(t, <-done, http.StatusAccepted)
}

func TestBatchValidationIsAllOrNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := b.alice.APIKey
	now := time.Now().UTC()
	many := make([]string, ingest.MaxBatchEvents+1)
	for i := range many {
		many[i] = batchEvent(fmt.Sprintf("r%d", i), 1, 1)
	}
	big := make([]string, 900)
	for i := range big {
		big[i] = fmt.Sprintf(`{"request_id":"r%d","user_id":%q,"model_id":"m","input_tokens":1,"output_tokens":1}`, i, strings.Repeat("u", 250))
	}
	cases := []struct {
		name, body string
		status     int
		typ        string
		fields     []string
	}{
		{"bad fields in two events", batch(batchEvent("a", 1, 1), batchEvent("b", -1, 1),
			`{"request_id":"c","timestamp":"`+now.Add(time.Hour).Format(time.RFC3339)+`","model_id":"m","input_tokens":1,"output_tokens":1}`),
			422, "validation-failed", []string{"events[1].input_tokens", "events[2].user_id", "events[2].timestamp"}},
		{"missing request_id", batch(batchEvent("a", 1, 1), event(1, 1)), 422, "validation-failed", []string{"events[1].request_id"}},
		{"repeated request_id", batch(batchEvent("a", 1, 1), batchEvent("b", 1, 1), batchEvent("a", 2, 2)),
			422, "validation-failed", []string{"events[0].request_id", "events[2].request_id"}},
		{"too many events", batch(many...), 422, "validation-failed", []string{"events"}},
		{"no events", `{"events":[]}`, 422, "validation-failed", []string{"events"}},
		{"events missing", `{}`, 422, "validation-failed", []string{"events"}},
		{"malformed JSON", `{"events":[`, 400, "malformed-request", []string{"body"}},
		{"unknown field in an event", batch(batchEvent("a", 1, 1), `{"request_id":"b","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":1,"cost":1}`),
			400, "malformed-request", []string{"events[1].cost"}},
		{"an event not an object", batch(batchEvent("a", 1, 1), `7`), 400, "malformed-request", []string{"events[1]"}},
		{"unknown top-level field", `{"events":[` + batchEvent("a", 1, 1) + `],"x":1}`, 400, "malformed-request", []string{"x"}},
		{"other tenant", batch(`{"request_id":"a","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":1,"tenant_id":"` + b.bob.ID.String() + `"}`),
			403, "tenant-mismatch", nil},
		{"over 1 MiB", batch(big...) + strings.Repeat(" ", 1<<20), 413, "payload-too-large", nil},
	}
	for _, c := range cases {
		r := b.postBatch(t, key, "k", c.body)
		m := requireProblem(t, r, c.status, c.typ)
		named := map[string]bool{}
		errs, _ := m["errors"].([]any)
		for _, e := range errs {
			named[e.(map[string]any)["field"].(string)] = true
		}
		for _, f := range c.fields {
			if !named[f] {
				t.Errorf("%s: problem does not name %q: %s", c.name, f, r.body)
			}
		}
		if len(c.fields) > 0 && len(named) != len(c.fields) {
			t.Errorf("%s: problem names %v, want exactly %v", c.name, named, c.fields)
		}
	}
	if b.logs(t) != 0 || b.jobs(t) != 0 || b.records(t) != 0 {
		t.Fatalf("a refused batch stored something: logs=%d jobs=%d records=%d", b.logs(t), b.jobs(t), b.records(t))
	}
	// 1,000 events is the limit, not over it; the key was never claimed.
	r := b.postBatch(t, key, "k", batch(many[:ingest.MaxBatchEvents]...))
	requireStatus(t, r, http.StatusAccepted)
	if r.header.Get("Idempotent-Replayed") != "" || b.logs(t) != ingest.MaxBatchEvents {
		t.Fatalf("a batch of %d: replayed=%q logs=%d", ingest.MaxBatchEvents, r.header.Get("Idempotent-Replayed"), b.logs(t))
	}
}

func TestBatchAnswersEarlierRequestIDsAsDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	single := b.post(t, b.capped.APIKey, "s", batchEvent("r1", 600, 100))
	requireStatus(t, single, http.StatusAccepted)
	r := b.postBatch(t, b.capped.APIKey, "b", batch(batchEvent("r2", 600, 100), batchEvent("r1", 600, 100), batchEvent("r3", 50, 0)))
	requireStatus(t, r, http.StatusAccepted)
	m := r.json(t)
	evs := batchEvents(t, r)
	if m["created"] != 2.0 || m["duplicates"] != 1.0 || evs[1]["duplicate"] != true || evs[1]["id"] != single.json(t)["id"] ||
		evs[0]["duplicate"] != false || evs[2]["duplicate"] != false {
		t.Fatalf("answer %s", r.body)
	}
	// The duplicate adds nothing to the allowance: r2 crosses it from 600.
	if o := evs[0]["overage"].(map[string]any); o["input_tokens"] != 200.0 || o["output_tokens"] != 0.0 {
		t.Fatalf("r2 overage = %v, want 200/0", o)
	}
	if o := evs[2]["overage"].(map[string]any); o["input_tokens"] != 50.0 {
		t.Fatalf("r3 overage = %v, want 50 input", o)
	}
	// The tenant's report job of one or two batch periods (a period may end
	// between two requests).
	if n := b.jobs(t); b.logs(t) != 3 || n < 1 || n > 2 {
		t.Fatalf("logs/jobs = %d/%d, want 3 logs (the duplicate recorded once) and 1 or 2 report jobs", b.logs(t), n)
	}
	// A batch of nothing but duplicates is still a 202 with every log.
	r = b.postBatch(t, b.capped.APIKey, "b2", batch(batchEvent("r3", 50, 0), batchEvent("r1", 600, 100)))
	requireStatus(t, r, http.StatusAccepted)
	if m := r.json(t); m["created"] != 0.0 || m["duplicates"] != 2.0 || b.logs(t) != 3 {
		t.Fatalf("answer %s, logs %d", r.body, b.logs(t))
	}
}

// requireExactTotals checks a tenant's total overage, that its allowance
// totals (summed over slots) are its logs' tokens, and that its finance
// counters (summed over slots) are its logs.
func (b *bundle) requireExactTotals(t *testing.T, tenant string, wantIn, wantOut int64) {
	t.Helper()
	var in, out, tokIn, tokOut, allowIn, allowOut int64
	if err := b.pool.QueryRow(context.Background(), `
		SELECT coalesce(sum(coalesce(overage_input_tokens, input_tokens)), 0), coalesce(sum(coalesce(overage_output_tokens, output_tokens)), 0),
			coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0),
			(SELECT coalesce(sum(input_tokens), 0) FROM allowance_usage WHERE tenant_id = $1),
			(SELECT coalesce(sum(output_tokens), 0) FROM allowance_usage WHERE tenant_id = $1)
		FROM usage_logs WHERE tenant_id = $1`, tenant).Scan(&in, &out, &tokIn, &tokOut, &allowIn, &allowOut); err != nil {
		t.Fatal(err)
	}
	if in != wantIn || out != wantOut {
		t.Fatalf("total overage = %d/%d, want %d/%d", in, out, wantIn, wantOut)
	}
	if allowIn != tokIn || allowOut != tokOut {
		t.Fatalf("allowance totals %d/%d, want the logs' tokens %d/%d", allowIn, allowOut, tokIn, tokOut)
	}
	// The finance counters, spread over slots, sum to the logs.
	var logs, cnt, cin, cout int64
	if err := b.pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM usage_logs WHERE tenant_id = $1),
			coalesce(sum(usage_logs), 0), coalesce(sum(overage_input_tokens), 0), coalesce(sum(overage_output_tokens), 0)
		FROM billing_counters WHERE tenant_id = $1`, tenant).Scan(&logs, &cnt, &cin, &cout); err != nil {
		t.Fatal(err)
	}
	if cnt != logs || cin != in || cout != out {
		t.Fatalf("billing counters %d logs %d/%d, want %d logs %d/%d", cnt, cin, cout, logs, in, out)
	}
}

// Concurrent batches of one tenant crossing its allowance: the split is
// exact — the overage is the usage above the allowance, once.
func TestConcurrentBatchesCrossingTheAllowanceSplitExactly(t *testing.T) {
	t.Parallel()
	b := setupUnlimited(t)
	const n, per = 20, 5 // 100 events x 30/10 = 3000/1000 tokens against 1000/500 included
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			evs := make([]string, per)
			for j := range evs {
				evs[j] = batchEvent(fmt.Sprintf("r%d-%d", i, j), 30, 10)
			}
			requireStatus(t, b.postBatch(t, b.capped.APIKey, fmt.Sprintf("b%d", i), batch(evs...)), http.StatusAccepted)
		}()
	}
	wg.Wait()
	b.requireExactTotals(t, b.capped.ID.String(), 3000-1000, 1000-500)
	if s := b.count(t, "SELECT count(*) FROM usage_logs WHERE coalesce(overage_input_tokens, input_tokens) BETWEEN 1 AND 29"); s > 1 {
		t.Fatalf("%d events straddle the input allowance, want at most 1", s)
	}
	if s := b.count(t, "SELECT count(*) FROM usage_logs WHERE coalesce(overage_output_tokens, output_tokens) BETWEEN 1 AND 9"); s > 1 {
		t.Fatalf("%d events straddle the output allowance, want at most 1", s)
	}
}

// concurrently posts n single events of 130/40 tokens to apiKey at once.
func (b *bundle) concurrently(t *testing.T, apiKey, prefix string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			requireStatus(t, b.post(t, apiKey, fmt.Sprintf("%s%d", prefix, i), event(130, 40)), http.StatusAccepted)
		}()
	}
	close(start)
	wg.Wait()
}

// A tenant with no allowance, or whose allowance is used up, takes no
// ordering lock: its events charge the slot rows, and still every event's
// overage is exactly its tokens.
func TestConcurrentEventsWithoutAllowanceLeftNeedNoOrderYetStayExact(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 40
	b.concurrently(t, b.alice.APIKey, "a", n)
	b.requireExactTotals(t, b.alice.ID.String(), n*130, n*40)
	if c := b.count(t, "SELECT count(*) FROM usage_logs WHERE tenant_id = $1 AND (coalesce(overage_input_tokens, input_tokens) <> 130 OR coalesce(overage_output_tokens, output_tokens) <> 40)", b.alice.ID); c != 0 {
		t.Fatalf("%d events of a tenant without allowance are not all overage", c)
	}
	if c := b.count(t, "SELECT count(*) FROM allowance_usage WHERE tenant_id = $1 AND slot = 0", b.alice.ID); c != 0 {
		t.Fatal("a tenant without allowance wrote the ordered slot: its events were serialised")
	}

	// Used up: one event takes the capped tenant over both allowances, then
	// n more run concurrently without the lock.
	requireStatus(t, b.post(t, b.capped.APIKey, "first", event(1000, 500)), http.StatusAccepted)
	b.concurrently(t, b.capped.APIKey, "c", n)
	b.requireExactTotals(t, b.capped.ID.String(), n*130, n*40)
	if c := b.count(t, "SELECT count(*) FROM allowance_usage WHERE tenant_id = $1 AND slot > 0", b.capped.ID); c == 0 {
		t.Fatal("events past the allowance all wrote the ordered slot")
	}
}

// Concurrent single events that cross the allowance, mixed with batches:
// the ordered and unordered paths together still split exactly.
func TestConcurrentSingleEventsAndBatchesCrossingTheAllowance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); b.concurrently(t, b.capped.APIKey, "s", 30) }() // 3900/1200
	go func() {
		defer wg.Done()
		for i := range 10 {
			requireStatus(t, b.postBatch(t, b.capped.APIKey, fmt.Sprintf("b%d", i),
				batch(batchEvent(fmt.Sprintf("x%d", i), 50, 20), batchEvent(fmt.Sprintf("y%d", i), 50, 20))), http.StatusAccepted) // 1000/400
		}
	}()
	wg.Wait()
	b.requireExactTotals(t, b.capped.ID.String(), 3900+1000-1000, 1200+400-500)
}

// Concurrent requests racing on the same request_ids under different keys:
// the unique index decides, the losers' transactions (their COMMIT
// pipelined with the failed insert) roll back whole and answer with the
// winner's log. Batches share request_ids in different orders, which must
// not deadlock.
func TestConcurrentRequestsSharingRequestIDsRecordEachOnce(t *testing.T) {
	t.Parallel()
	b := setupUnlimited(t)
	var wg sync.WaitGroup
	singles := make([]response, 10)
	for i := range singles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			singles[i] = b.post(t, b.alice.APIKey, fmt.Sprintf("s%d", i), batchEvent("same", 7, 7))
		}()
	}
	batches := make([]response, 10)
	for i := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			evs := []string{batchEvent("x", 1, 1), batchEvent("y", 2, 2), batchEvent("z", 3, 3)}
			if i%2 == 1 {
				evs[0], evs[2] = evs[2], evs[0]
			}
			batches[i] = b.postBatch(t, b.alice.APIKey, fmt.Sprintf("b%d", i), batch(evs...))
		}()
	}
	wg.Wait()
	created := 0
	for _, r := range singles {
		switch r.status {
		case http.StatusAccepted:
			created++
		case http.StatusOK:
			if r.json(t)["duplicate"] != true {
				t.Fatalf("200 without duplicate: %s", r.body)
			}
		default:
			t.Fatalf("single: %d %s", r.status, r.body)
		}
	}
	if created != 1 {
		t.Fatalf("%d singles recorded the same request_id, want 1", created)
	}
	total := 0
	for _, r := range batches {
		requireStatus(t, r, http.StatusAccepted)
		total += int(r.json(t)["created"].(float64))
	}
	if total != 3 {
		t.Fatalf("batches created %d logs in all, want 3 (x, y, z once)", total)
	}
	if b.logs(t) != 4 || b.jobs(t) < 1 {
		t.Fatalf("logs/jobs = %d/%d, want 4 logs and their tenant's report job", b.logs(t), b.jobs(t))
	}
	b.requireExactTotals(t, b.alice.ID.String(), 7+1+2+3, 7+1+2+3)
}

// A batch whose events fall in two allowance periods — the tenant's Stripe
// subscription period and, before it, the calendar month — counts each
// against its own period, in request order.
func TestBatchSplitsEachPeriodSeparately(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now().UTC()
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO tenant_subscriptions
		(tenant_id, stripe_subscription_id, status, current_period_start, current_period_end, event_created)
		VALUES ($1, 'sub_1', 'active', $2, $3, now())`, b.capped.ID, now.Add(-2*time.Hour), now.Add(30*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	at := func(rid string, d time.Duration, in int) string {
		return fmt.Sprintf(`{"request_id":%q,"timestamp":%q,"user_id":"u","model_id":"m","input_tokens":%d,"output_tokens":0}`,
			rid, now.Add(d).Format(time.RFC3339Nano), in)
	}
	r := b.postBatch(t, b.capped.APIKey, "k", batch(at("a", -time.Hour, 800), at("b", -3*time.Hour, 800), at("c", -time.Hour, 800), at("d", -3*time.Hour, 300)))
	requireStatus(t, r, http.StatusAccepted)
	want := []float64{0, 0, 600, 100} // 1,000 included per period
	for i, e := range batchEvents(t, r) {
		if got := e["overage"].(map[string]any)["input_tokens"]; got != want[i] {
			t.Fatalf("event %d overage %v, want %v: %s", i, got, want[i], r.body)
		}
	}
	if n := b.count(t, "SELECT count(DISTINCT period_start) FROM allowance_usage WHERE tenant_id = $1", b.capped.ID); n != 2 {
		t.Fatalf("%d allowance periods, want 2", n)
	}
	b.requireExactTotals(t, b.capped.ID.String(), 700, 0)
}
