package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/overage-billing/overage/client"
	"github.com/overage-billing/overage/internal/apitest"
)

// faultProxy sits between the client and the real server. Each request
// takes the next fault from its script (none once the script is done) and
// it records what the client sent.
type faultProxy struct {
	mu     sync.Mutex
	script []string
	seen   []seenRequest
	target *httputil.ReverseProxy
	origin string
}

type seenRequest struct {
	key  string
	body string
}

const (
	faultDropAfterCommit = "drop-after-commit" // the server commits, the client never hears
	faultUnavailable     = "503"               // answered by the proxy, with Retry-After: 1
	faultInProgress      = "409-in-progress"
	faultTooMany         = "429"
)

func newFaultProxy(t *testing.T, origin string, script ...string) *httptest.Server {
	u, err := url.Parse(origin)
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{script: script, target: httputil.NewSingleHostReverseProxy(u), origin: origin}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	proxies.Store(srv.URL, p)
	return srv
}

var proxies sync.Map

func proxyOf(srv *httptest.Server) *faultProxy {
	p, _ := proxies.Load(srv.URL)
	return p.(*faultProxy)
}

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	p.mu.Lock()
	p.seen = append(p.seen, seenRequest{key: r.Header.Get("Idempotency-Key"), body: string(body)})
	fault := ""
	if len(p.script) > 0 {
		fault, p.script = p.script[0], p.script[1:]
	}
	p.mu.Unlock()
	problem := func(status int, typ string) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"type":"https://overage.dev/problems/`+typ+`","title":"x","status":0}`)
	}
	switch fault {
	case faultDropAfterCommit:
		// Let the real server finish and commit, then lose its answer.
		rec := httptest.NewRecorder()
		p.target.ServeHTTP(rec, r)
		conn, _, _ := w.(http.Hijacker).Hijack()
		_ = conn.Close()
	case faultUnavailable:
		problem(http.StatusServiceUnavailable, "service-unavailable")
	case faultInProgress:
		problem(http.StatusConflict, "idempotency-key-in-progress")
	case faultTooMany:
		problem(http.StatusTooManyRequests, "rate-limited")
	default:
		p.target.ServeHTTP(w, r)
	}
}

func (p *faultProxy) requests() []seenRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seenRequest(nil), p.seen...)
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
func requireSameRequest(t *testing.T, reqs []seenRequest, n int) {
	t.Helper()
	if len(reqs) != n {
		t.Fatalf("%d attempts reached the proxy, want %d", len(reqs), n)
	}
	for _, r := range reqs[1:] {
		if r != reqs[0] {
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
	proxy := newFaultProxy(t, b.srv.URL, faultDropAfterCommit)
	e := ev
	e.RequestID = "" // the client mints the key itself
	res, err := b.client(t, proxy.URL).Record(context.Background(), e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Replayed || res.Attempts != 2 {
		t.Fatalf("result %+v, want a replay on the second attempt", res)
	}
	requireSameRequest(t, proxyOf(proxy).requests(), 2)
	if n := b.logs(t); n != 1 {
		t.Fatalf("%d usage logs, want 1", n)
	}
}

func TestRetriesUnavailableInProgressAndTooManyHonouringRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := newFaultProxy(t, b.srv.URL, faultUnavailable, faultInProgress, faultTooMany)
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
	requireSameRequest(t, proxyOf(proxy).requests(), 4)
}

func TestNeverRetriesKeyReuseOrOtherClientErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := newFaultProxy(t, b.srv.URL)
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
	if n := len(proxyOf(proxy).requests()); n != 3 {
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
