package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/overage-billing/overage/client"
	"github.com/overage-billing/overage/internal/testkit/apitest"
	"github.com/overage-billing/overage/internal/testkit/flakyproxy"
)

func newFaultProxy(t *testing.T, origin string, script ...flakyproxy.Fault) (*httptest.Server, *flakyproxy.Proxy) {
	t.Helper()
	p, err := flakyproxy.New(origin, flakyproxy.Script(script...))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv, p
}

type bundle struct {
	srv    *apitest.Server
	apiKey string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	s := apitest.Start(t)
	return &bundle{srv: s, apiKey: s.Tenant(t, "acme", 0, 0).APIKey}
}

func (b *bundle) client(t *testing.T, baseURL string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{BaseURL: baseURL, APIKey: b.apiKey, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, MaxAttempts: 5})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (b *bundle) logs(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.srv.Pool.QueryRow(context.Background(), "SELECT count(*) FROM usage_logs").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

var ev = client.UsageEvent{RequestID: "chatcmpl-1", UserID: "u", ModelID: "gpt-4o", InputTokens: 1200, OutputTokens: 350}

// requireSameRequest checks every attempt carried the same key and body.
func requireSameRequest(t *testing.T, reqs []flakyproxy.Seen, n int) {
	t.Helper()
	if len(reqs) != n {
		t.Fatalf("%d attempts reached the proxy, want %d", len(reqs), n)
	}
	for _, r := range reqs[1:] {
		if r.Key != reqs[0].Key || r.Body != reqs[0].Body {
			t.Fatalf("a retry changed the request: %+v vs %+v", r, reqs[0])
		}
	}
}

func TestRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, err := b.client(t, b.srv.URL).Record(context.Background(), ev, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed || res.Duplicate || res.Key != "chatcmpl-1" || res.Attempts != 1 || res.Log.Overage.InputTokens != 1200 || res.Log.BillingStatus != "pending" {
		t.Fatalf("result %+v", res)
	}
}

func TestLostResponseIsRetriedWithTheSameKeyAndRecordedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, fp := newFaultProxy(t, b.srv.URL, flakyproxy.DropAfterCommit)
	e := ev
	e.RequestID = "" // the client mints the key itself
	res, err := b.client(t, proxy.URL).Record(context.Background(), e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Replayed || res.Attempts != 2 {
		t.Fatalf("result %+v, want a replay on the second attempt", res)
	}
	requireSameRequest(t, fp.Seen(), 2)
	if n := b.logs(t); n != 1 {
		t.Fatalf("%d usage logs, want 1", n)
	}
}

func TestRetriesUnavailableInProgressAndTooManyHonouringRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, fp := newFaultProxy(t, b.srv.URL, flakyproxy.Unavailable, flakyproxy.InProgress, flakyproxy.TooMany)
	start := time.Now()
	res, err := b.client(t, proxy.URL).Record(context.Background(), ev, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 4 || res.Replayed {
		t.Fatalf("result %+v, want success on attempt 4", res)
	}
	if elapsed := time.Since(start); elapsed < 3*time.Second {
		t.Fatalf("took %s: three Retry-After: 1 answers were not honoured", elapsed)
	}
	requireSameRequest(t, fp.Seen(), 4)
}

func TestNeverRetriesKeyReuseOrOtherClientErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, fp := newFaultProxy(t, b.srv.URL)
	c := b.client(t, proxy.URL)
	if _, err := c.Record(context.Background(), ev, &client.RecordOpts{IdempotencyKey: "k"}); err != nil {
		t.Fatal(err)
	}
	other := ev
	other.InputTokens = 1
	_, err := c.Record(context.Background(), other, &client.RecordOpts{IdempotencyKey: "k"})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict || apiErr.Type != client.ProblemKeyReused || apiErr.Attempts != 1 {
		t.Fatalf("key reuse: %v", err)
	}
	bad := ev
	bad.InputTokens, bad.OutputTokens = 0, 0
	_, err = c.Record(context.Background(), bad, &client.RecordOpts{IdempotencyKey: "k2"})
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnprocessableEntity || apiErr.Attempts != 1 || len(apiErr.Fields) == 0 {
		t.Fatalf("invalid event: %v", err)
	}
	if n := len(fp.Seen()); n != 3 {
		t.Fatalf("%d requests, want 3 (no retries)", n)
	}
}

func TestDuplicateRequestIDUnderAnotherKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, b.srv.URL)
	first, err := c.Record(context.Background(), ev, nil)
	if err != nil {
		t.Fatal(err)
	}
	dup, err := c.Record(context.Background(), ev, &client.RecordOpts{IdempotencyKey: "another"})
	if err != nil || !dup.Duplicate || dup.Log.ID != first.Log.ID {
		t.Fatalf("duplicate: %+v %v", dup, err)
	}
}

func TestAttemptsAreBoundedAndContextHonoured(t *testing.T) {
	t.Parallel()
	b := setup(t)
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
	}))
	t.Cleanup(down.Close)
	_, err := b.client(t, down.URL).Record(context.Background(), ev, nil)
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Attempts != 5 || apiErr.Status != http.StatusBadGateway {
		t.Fatalf("err = %v, want the 502 after 5 attempts", err)
	}

	slow, err := client.New(client.Config{BaseURL: down.URL, APIKey: "k", BaseDelay: time.Hour, MaxDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = slow.Record(ctx, ev, nil)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("err = %v after %s, want the context's deadline promptly", err, time.Since(start))
	}
}

func batchOf(ids ...string) []client.UsageEvent {
	out := make([]client.UsageEvent, len(ids))
	for i, id := range ids {
		out[i] = client.UsageEvent{RequestID: id, UserID: "u", ModelID: "gpt-4o", InputTokens: int64(100 + i), OutputTokens: 10}
	}
	return out
}

func TestRecordBatchLostAnswerIsReplayedAndRecordedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, fp := newFaultProxy(t, b.srv.URL, flakyproxy.DropAfterCommit)
	res, err := b.client(t, proxy.URL).RecordBatch(context.Background(), batchOf("a", "b", "c"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Replayed || res.Attempts != 2 || res.Created != 3 || res.Duplicates != 0 || len(res.Events) != 3 {
		t.Fatalf("result %+v, want the stored answer of 3 new events replayed on attempt 2", res)
	}
	for i, e := range res.Events {
		if e.Index != i || e.Duplicate || e.RequestID == nil || *e.RequestID != []string{"a", "b", "c"}[i] || e.BillingStatus != "pending" {
			t.Fatalf("event %d = %+v", i, e)
		}
	}
	requireSameRequest(t, fp.Seen(), 2)
	if n := b.logs(t); n != 3 {
		t.Fatalf("%d usage logs, want 3", n)
	}
}

// A client that gave up on a batch (its answer lost every time) and sends
// its events again regrouped under a new key bills nothing twice: the
// events already recorded come back as duplicates of their first log.
func TestRecordBatchRegroupedUnderANewKeyBillsNothingTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, _ := newFaultProxy(t, b.srv.URL, flakyproxy.DropAfterCommit, flakyproxy.DropAfterCommit, flakyproxy.DropAfterCommit,
		flakyproxy.DropAfterCommit, flakyproxy.DropAfterCommit)
	first := batchOf("a", "b", "c")
	_, err := b.client(t, proxy.URL).RecordBatch(context.Background(), first, nil)
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Err == nil {
		t.Fatalf("err = %v, want no answer after the attempts", err)
	}
	regrouped := append(batchOf("d"), first[1], first[2])
	res, err := b.client(t, b.srv.URL).RecordBatch(context.Background(), regrouped, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Created != 1 || res.Duplicates != 2 || res.Events[0].Duplicate || !res.Events[1].Duplicate || !res.Events[2].Duplicate {
		t.Fatalf("result %+v, want d new and b, c duplicates", res)
	}
	if n := b.logs(t); n != 4 {
		t.Fatalf("%d usage logs, want 4 (a, b, c, d once each)", n)
	}
	var billed int64
	if err := b.srv.Pool.QueryRow(context.Background(), "SELECT sum(coalesce(overage_input_tokens, input_tokens)) FROM usage_logs").Scan(&billed); err != nil {
		t.Fatal(err)
	}
	if billed != 100+101+102+100 {
		t.Fatalf("overage = %d, want each event's tokens once (403)", billed)
	}
}

func TestRecordBatchRefusesWithoutRetryingAndChecksItsInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, fp := newFaultProxy(t, b.srv.URL)
	c := b.client(t, proxy.URL)
	bad := batchOf("a", "b")
	bad[1].InputTokens, bad[1].OutputTokens = 0, 0
	_, err := c.RecordBatch(context.Background(), bad, nil)
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnprocessableEntity || apiErr.Attempts != 1 ||
		len(apiErr.Fields) != 1 || apiErr.Fields[0].Field != "events[1].input_tokens" {
		t.Fatalf("invalid batch: %v (%+v)", err, apiErr)
	}
	if _, err := c.RecordBatch(context.Background(), batchOf("a", ""), nil); err == nil {
		t.Fatal("a batched event without RequestID was sent")
	}
	if _, err := c.RecordBatch(context.Background(), nil, nil); err == nil {
		t.Fatal("an empty batch was sent")
	}
	if n := len(fp.Seen()); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
}
