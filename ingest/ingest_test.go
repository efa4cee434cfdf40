package ingest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/apitest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/usagelog"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertest"
)

const adminToken = apitest.AdminToken

type bundle struct {
	*apitest.Server
	pool   *pgxpool.Pool
	svc    *ingest.Service
	alice  *tenants.Created
	bob    *tenants.Created
	capped *tenants.Created // 1,000 input and 500 output tokens included
}

// setup starts the API wired as `overage serve` wires it, on a fresh
// database, with three tenants.
func setup(t *testing.T) *bundle {
	t.Helper()
	return withTenants(t, apitest.Start(t))
}

func withTenants(t *testing.T, s *apitest.Server) *bundle {
	t.Helper()
	return &bundle{Server: s, pool: s.Pool, svc: s.Service,
		alice: s.Tenant(t, "alice", 0, 0), bob: s.Tenant(t, "bob", 0, 0), capped: s.Tenant(t, "capped", 1000, 500)}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response is not JSON: %v: %s", err, r.body)
	}
	return m
}

func (b *bundle) do(t *testing.T, method, path, apiKey, idemKey, body string) response {
	t.Helper()
	req, err := http.NewRequest(method, b.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	rb, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: rb}
}

func (b *bundle) post(t *testing.T, apiKey, idemKey, body string) response {
	t.Helper()
	return b.do(t, http.MethodPost, "/v1/usage-events", apiKey, idemKey, body)
}

func event(in, out int) string {
	return fmt.Sprintf(`{"user_id":"u_42","model_id":"gpt-4o","input_tokens":%d,"output_tokens":%d}`, in, out)
}

func (b *bundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func (b *bundle) logs(t *testing.T) int { return b.count(t, "SELECT count(*) FROM usage_logs") }

// jobs counts the report jobs River lists.
func (b *bundle) jobs(t *testing.T) int {
	t.Helper()
	res, err := b.River.JobList(context.Background(), river.NewJobListParams().Kinds(outbox.ReportArgs{}.Kind()).First(10000))
	if err != nil {
		t.Fatal(err)
	}
	return len(res.Jobs)
}
func (b *bundle) records(t *testing.T) int {
	return b.count(t, "SELECT count(*) FROM idempotency_keys")
}

func requireStatus(t *testing.T, r response, want int) {
	t.Helper()
	if r.status != want {
		t.Fatalf("status = %d, want %d; body: %s", r.status, want, r.body)
	}
}

func requireProblem(t *testing.T, r response, status int, typ string) map[string]any {
	t.Helper()
	requireStatus(t, r, status)
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json", ct)
	}
	m := r.json(t)
	if m["type"] != "https://overage.dev/problems/"+typ {
		t.Fatalf("problem type = %v, want %s; body: %s", m["type"], typ, r.body)
	}
	return m
}

func TestCreateRecordsLogJobAndResponseTogether(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.post(t, b.alice.APIKey, "k1", `{"request_id":"chatcmpl-1","timestamp":"`+time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)+`","user_id":"u_42","model_id":"gpt-4o","input_tokens":1200,"output_tokens":350,"tenant_id":"`+b.alice.ID.String()+`"}`)
	requireStatus(t, r, http.StatusAccepted)
	m := r.json(t)
	if m["billing_status"] != "pending" || m["duplicate"] != false || m["input_tokens"] != 1200.0 || m["request_id"] != "chatcmpl-1" {
		t.Fatalf("unexpected body: %s", r.body)
	}
	over := m["overage"].(map[string]any)
	if over["input_tokens"] != 1200.0 || over["output_tokens"] != 350.0 {
		t.Fatalf("overage = %v, want all usage (no allowance)", over)
	}
	if r.header.Get("Idempotent-Replayed") != "" {
		t.Fatal("a first response must not say it was replayed")
	}
	if b.logs(t) != 1 || b.jobs(t) != 1 || b.records(t) != 1 {
		t.Fatalf("logs/jobs/records = %d/%d/%d, want 1/1/1", b.logs(t), b.jobs(t), b.records(t))
	}
	job := rivertest.RequireInserted(context.Background(), t, riverpgxv5.New(b.pool), &outbox.ReportArgs{}, &rivertest.RequireInsertedOpts{Queue: outbox.QueueReport})
	if job.Args.TenantID != b.alice.ID {
		t.Fatalf("job args = %+v, want the tenant of usage log %v", job.Args, m["id"])
	}
	id, err := uuid.Parse(m["id"].(string))
	if err != nil || id.Version() != 7 {
		t.Fatalf("usage log id %v is not a time-ordered UUIDv7", m["id"])
	}
}

func TestReplayIsByteIdentical(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.post(t, b.alice.APIKey, "k1", event(10, 5))
	requireStatus(t, first, http.StatusAccepted)
	second := b.post(t, b.alice.APIKey, "k1", event(10, 5))
	requireStatus(t, second, http.StatusAccepted)
	if !bytes.Equal(first.body, second.body) {
		t.Fatalf("replay differs:\n%s\n%s", first.body, second.body)
	}
	if second.header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("replay lacks Idempotent-Replayed: true")
	}
	if b.logs(t) != 1 || b.jobs(t) != 1 {
		t.Fatalf("replay recorded again: logs=%d jobs=%d", b.logs(t), b.jobs(t))
	}
}

func TestBareAndQuotedKeyAreTheSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requireStatus(t, b.post(t, b.alice.APIKey, `abc-1`, event(10, 5)), http.StatusAccepted)
	r := b.post(t, b.alice.APIKey, `"abc-1"`, event(10, 5))
	requireStatus(t, r, http.StatusAccepted)
	if r.header.Get("Idempotent-Replayed") != "true" || b.logs(t) != 1 {
		t.Fatalf("quoted key was not the bare key: replayed=%q logs=%d", r.header.Get("Idempotent-Replayed"), b.logs(t))
	}
	// An escaped quote inside a structured-field string is part of the key.
	requireStatus(t, b.post(t, b.alice.APIKey, `"a\"b"`, event(10, 5)), http.StatusAccepted)
	r = b.post(t, b.alice.APIKey, `a"b`, event(10, 5))
	if r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("escaped structured-field key was not the bare key: %s", r.body)
	}
}

func TestFingerprintIgnoresKeyOrderAndWhitespace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requireStatus(t, b.post(t, b.alice.APIKey, "k", `{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2}`), http.StatusAccepted)
	r := b.post(t, b.alice.APIKey, "k", "{\n  \"output_tokens\": 2,\n  \"input_tokens\" : 1, \"model_id\":\"m\",\t\"user_id\":\"u\"\n}")
	requireStatus(t, r, http.StatusAccepted)
	if r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("reordered body was not recognised as the same request: %s", r.body)
	}
}

func TestKeyReuseWithAnotherBody(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requireStatus(t, b.post(t, b.alice.APIKey, "k", event(10, 5)), http.StatusAccepted)
	requireProblem(t, b.post(t, b.alice.APIKey, "k", event(11, 5)), http.StatusConflict, "idempotency-key-reused")
	if b.logs(t) != 1 {
		t.Fatalf("logs = %d, want 1", b.logs(t))
	}
}

func TestSameKeyTwoTenantsTwoLogs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.post(t, b.alice.APIKey, "shared", event(10, 5))
	c := b.post(t, b.bob.APIKey, "shared", event(10, 5))
	requireStatus(t, a, http.StatusAccepted)
	requireStatus(t, c, http.StatusAccepted)
	if c.header.Get("Idempotent-Replayed") != "" || a.json(t)["id"] == c.json(t)["id"] {
		t.Fatal("a key of one tenant answered for another")
	}
	if b.logs(t) != 2 || b.jobs(t) != 2 {
		t.Fatalf("logs/jobs = %d/%d, want 2/2", b.logs(t), b.jobs(t))
	}
}

func TestRequestIDReusedUnderNewKeyIsADuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := `{"request_id":"chatcmpl-9","user_id":"u","model_id":"m","input_tokens":100,"output_tokens":1}`
	first := b.post(t, b.alice.APIKey, "k1", body)
	requireStatus(t, first, http.StatusAccepted)
	dup := b.post(t, b.alice.APIKey, "k2", body)
	requireStatus(t, dup, http.StatusOK)
	m := dup.json(t)
	if m["duplicate"] != true || m["id"] != first.json(t)["id"] {
		t.Fatalf("duplicate answer = %s", dup.body)
	}
	if b.logs(t) != 1 || b.jobs(t) != 1 {
		t.Fatalf("a duplicate request_id recorded or queued again: logs=%d jobs=%d", b.logs(t), b.jobs(t))
	}
	var overage int
	if err := b.pool.QueryRow(context.Background(), "SELECT input_tokens FROM allowance_usage").Scan(&overage); err != nil || overage != 100 {
		t.Fatalf("allowance counter = %d (%v), want 100: the duplicate must not count", overage, err)
	}
	// The duplicate outcome is stored under k2 and replayed.
	again := b.post(t, b.alice.APIKey, "k2", body)
	if again.status != http.StatusOK || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, dup.body) {
		t.Fatalf("duplicate outcome not replayed: %d %s", again.status, again.body)
	}
	// Another tenant may use the same request_id.
	requireStatus(t, b.post(t, b.bob.APIKey, "k1", body), http.StatusAccepted)
}

func TestRejectedRequestsStoreNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now().UTC()
	key := b.alice.APIKey
	long := `{"user_id":"` + strings.Repeat("x", 70<<10) + `","model_id":"m","input_tokens":1,"output_tokens":1}`
	cases := []struct {
		name, apiKey, idemKey, body string
		status                      int
		typ, field                  string
	}{
		{"missing key", key, "", event(1, 1), 400, "idempotency-key-invalid", "Idempotency-Key"},
		{"key too long", key, strings.Repeat("k", 256), event(1, 1), 400, "idempotency-key-invalid", "Idempotency-Key"},
		{"key not ascii", key, "clé", event(1, 1), 400, "idempotency-key-invalid", "Idempotency-Key"},
		{"key bad quoting", key, `"abc`, event(1, 1), 400, "idempotency-key-invalid", "Idempotency-Key"},
		{"no api key", "", "k", event(1, 1), 401, "unauthorized", ""},
		{"unknown api key", "ovg_nope", "k", event(1, 1), 401, "unauthorized", ""},
		{"other tenant", key, "k", `{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":1,"tenant_id":"` + b.bob.ID.String() + `"}`, 403, "tenant-mismatch", ""},
		{"not json", key, "k", `{"user_id":`, 400, "malformed-request", "body"},
		{"not an object", key, "k", `[1,2]`, 400, "malformed-request", "body"},
		{"unknown field", key, "k", `{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":1,"cost":3}`, 400, "malformed-request", "cost"},
		{"negative tokens", key, "k", event(-1, 5), 422, "validation-failed", "input_tokens"},
		{"fractional tokens", key, "k", `{"user_id":"u","model_id":"m","input_tokens":1.5,"output_tokens":1}`, 422, "validation-failed", "input_tokens"},
		{"string tokens", key, "k", `{"user_id":"u","model_id":"m","input_tokens":"1","output_tokens":1}`, 422, "validation-failed", "input_tokens"},
		{"both zero", key, "k", event(0, 0), 422, "validation-failed", "input_tokens"},
		{"missing user", key, "k", `{"model_id":"m","input_tokens":1,"output_tokens":1}`, 422, "validation-failed", "user_id"},
		{"future", key, "k", `{"timestamp":"` + now.Add(10*time.Minute).Format(time.RFC3339) + `","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":1}`, 422, "validation-failed", "timestamp"},
		{"too old", key, "k", `{"timestamp":"` + now.Add(-36*24*time.Hour).Format(time.RFC3339) + `","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":1}`, 422, "validation-failed", "timestamp"},
		{"bad timestamp", key, "k", `{"timestamp":"yesterday","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":1}`, 422, "validation-failed", "timestamp"},
		{"too large", key, "k", long, 413, "payload-too-large", ""},
	}
	for _, c := range cases {
		r := b.post(t, c.apiKey, c.idemKey, c.body)
		m := requireProblem(t, r, c.status, c.typ)
		if c.field != "" {
			found := false
			errs, _ := m["errors"].([]any)
			for _, e := range errs {
				if e.(map[string]any)["field"] == c.field {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: problem does not name field %q: %s", c.name, c.field, r.body)
			}
		}
	}
	if b.logs(t) != 0 || b.jobs(t) != 0 || b.records(t) != 0 {
		t.Fatalf("a refused request stored something: logs=%d jobs=%d records=%d", b.logs(t), b.jobs(t), b.records(t))
	}
	// The key "k" was never claimed: a valid request with it is new.
	r := b.post(t, key, "k", event(1, 1))
	requireStatus(t, r, http.StatusAccepted)
	if r.header.Get("Idempotent-Replayed") != "" {
		t.Fatal("a refused request's key was stored")
	}
}

func TestRevokedKeyIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := tenants.NewStore(b.pool).RevokeKey(context.Background(), b.alice.APIKey); err != nil {
		t.Fatal(err)
	}
	requireProblem(t, b.post(t, b.alice.APIKey, "k", event(1, 1)), http.StatusUnauthorized, "unauthorized")
}

func TestConcurrentSameKeyRecordsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 50
	var wg sync.WaitGroup
	results := make([]response, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = b.post(t, b.alice.APIKey, "same", event(100, 10))
		}()
	}
	close(start)
	wg.Wait()
	if b.logs(t) != 1 || b.jobs(t) != 1 {
		t.Fatalf("logs/jobs = %d/%d, want exactly 1/1", b.logs(t), b.jobs(t))
	}
	var id string
	if err := b.pool.QueryRow(context.Background(), "SELECT id::text FROM usage_logs").Scan(&id); err != nil {
		t.Fatal(err)
	}
	accepted := 0
	for _, r := range results {
		switch r.status {
		case http.StatusAccepted:
			accepted++
			if r.json(t)["id"] != id {
				t.Fatalf("202 names log %v, want %s", r.json(t)["id"], id)
			}
		case http.StatusConflict:
			requireProblem(t, r, http.StatusConflict, "idempotency-key-in-progress")
			if r.header.Get("Retry-After") == "" {
				t.Fatal("409 in progress without Retry-After")
			}
		default:
			t.Fatalf("unexpected answer %d: %s", r.status, r.body)
		}
	}
	if accepted == 0 {
		t.Fatal("no request was accepted")
	}
}

func TestFailureBeforeCommitLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fail := true
	var mu sync.Mutex
	ingest.SetBeforeWrites(b.svc, func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return errors.New("injected failure after the usage log insert")
		}
		return nil
	})
	body := `{"request_id":"r1","user_id":"u","model_id":"m","input_tokens":100,"output_tokens":1}`
	requireProblem(t, b.post(t, b.capped.APIKey, "k", body), http.StatusInternalServerError, "internal")
	if b.logs(t) != 0 || b.jobs(t) != 0 || b.records(t) != 0 || b.count(t, "SELECT count(*) FROM allowance_usage") != 0 {
		t.Fatal("a failed transaction left rows behind")
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	r := b.post(t, b.capped.APIKey, "k", body)
	requireStatus(t, r, http.StatusAccepted)
	if b.logs(t) != 1 || b.jobs(t) != 0 { // under the allowance: not billable, no job
		t.Fatalf("logs/jobs = %d/%d, want 1/0", b.logs(t), b.jobs(t))
	}
}

func overageOf(t *testing.T, r response) (int64, int64) {
	t.Helper()
	o := r.json(t)["overage"].(map[string]any)
	return int64(o["input_tokens"].(float64)), int64(o["output_tokens"].(float64))
}

func TestOverageSplitsAcrossTheAllowance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ts := func(d time.Time) string { return d.Format(time.RFC3339) }
	now := time.Now().UTC()
	thisMonth := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	// An event before this month's start, when the month is young enough,
	// lands in the previous month's allowance; else use this month only.
	at := now.Add(-time.Minute)
	post := func(key string, in, out int, when time.Time) response {
		r := b.post(t, b.capped.APIKey, key, fmt.Sprintf(`{"timestamp":"%s","user_id":"u","model_id":"m","input_tokens":%d,"output_tokens":%d}`, ts(when), in, out))
		requireStatus(t, r, http.StatusAccepted)
		return r
	}
	r1 := post("a", 600, 300, at)
	if in, out := overageOf(t, r1); in != 0 || out != 0 || r1.json(t)["billing_status"] != "not_billable" {
		t.Fatalf("under the allowance: overage %d/%d status %v", in, out, r1.json(t)["billing_status"])
	}
	if n := b.jobs(t); n != 0 {
		t.Fatalf("jobs = %d after a log with no overage, want 0 (only billable logs are queued)", n)
	}
	r2 := post("b", 600, 300, at) // totals 1200/600 against 1000/500
	if in, out := overageOf(t, r2); in != 200 || out != 100 || r2.json(t)["billing_status"] != "pending" {
		t.Fatalf("crossing the allowance: overage %d/%d, want 200/100", in, out)
	}
	r3 := post("c", 50, 0, at)
	if in, out := overageOf(t, r3); in != 50 || out != 0 {
		t.Fatalf("above the allowance: overage %d/%d, want 50/0", in, out)
	}
	// The previous month has its own allowance, starting from zero.
	prev := thisMonth.Add(-time.Hour)
	if now.Sub(prev) < 34*24*time.Hour {
		r4 := post("d", 900, 0, prev)
		if in, _ := overageOf(t, r4); in != 0 {
			t.Fatalf("a new month did not start from zero: overage %d", in)
		}
	}
	// One report job per tenant and batch period covers every billable log
	// of it; a period may end between two posts.
	if n := b.jobs(t); n < 1 || n > 2 {
		t.Fatalf("jobs = %d, want the tenant's report job of one or two batch periods", n)
	}
}

func TestConcurrentEventsCrossingTheAllowanceSplitExactly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 20 // 20 x 130 = 2600 input tokens against 1000 included
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			requireStatus(t, b.post(t, b.capped.APIKey, fmt.Sprintf("k%d", i), event(130, 40)), http.StatusAccepted)
		}()
	}
	wg.Wait()
	var in, out int64
	if err := b.pool.QueryRow(context.Background(), "SELECT sum(coalesce(overage_input_tokens, input_tokens)), sum(coalesce(overage_output_tokens, output_tokens)) FROM usage_logs").Scan(&in, &out); err != nil {
		t.Fatal(err)
	}
	if in != 2600-1000 || out != 800-500 {
		t.Fatalf("total overage = %d/%d, want 1600/300", in, out)
	}
	// Exactly one event straddles each allowance.
	straddle := b.count(t, "SELECT count(*) FROM usage_logs WHERE coalesce(overage_input_tokens, input_tokens) BETWEEN 1 AND 129")
	if straddle > 1 {
		t.Fatalf("%d events straddle the input allowance, want at most 1", straddle)
	}
}

func TestExpiredKeyStartsANewRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requireStatus(t, b.post(t, b.alice.APIKey, "k", event(1, 1)), http.StatusAccepted)
	if _, err := b.pool.Exec(context.Background(), "UPDATE idempotency_keys SET expires_at = now() - interval '1 second'"); err != nil {
		t.Fatal(err)
	}
	r := b.post(t, b.alice.APIKey, "k", event(2, 2))
	requireStatus(t, r, http.StatusAccepted)
	if r.header.Get("Idempotent-Replayed") != "" || b.logs(t) != 2 || b.records(t) != 1 {
		t.Fatalf("expired key was not a new request: logs=%d records=%d", b.logs(t), b.records(t))
	}
	// The record was written within the last minute; it lives 24 hours.
	var ttl float64
	if err := b.pool.QueryRow(context.Background(), "SELECT extract(epoch FROM expires_at - now()) FROM idempotency_keys").Scan(&ttl); err != nil || ttl > 24*3600 || ttl < 24*3600-60 {
		t.Fatalf("record expires in %v s (%v), want 24 h from its write", ttl, err)
	}
}

func TestGetUsageLog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.post(t, b.alice.APIKey, "k", event(7, 3)).json(t)["id"].(string)
	r := b.do(t, http.MethodGet, "/v1/usage-events/"+id, b.alice.APIKey, "", "")
	requireStatus(t, r, http.StatusOK)
	m := r.json(t)
	if m["billing_status"] != "pending" || m["billed_at"] != nil {
		t.Fatalf("unexpected log: %s", r.body)
	}
	evs := m["stripe_meter_events"].([]any)
	if len(evs) != 2 || evs[0].(map[string]any)["identifier"] != nil || evs[1].(map[string]any)["identifier"] != nil {
		t.Fatalf("stripe identifiers before the log joins a report = %v, want null", evs)
	}
	// A second log joins the same reports, led by the first.
	second := b.post(t, b.alice.APIKey, "k2", event(1, 1)).json(t)["id"].(string)
	if _, err := usagelog.New(b.pool).Form(context.Background(), usagelog.FormParams{TenantID: b.alice.ID, MaxLogs: 10,
		Lease: time.Minute, Guard: usagelog.GuardFor(24 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{id, second} {
		evs = b.do(t, http.MethodGet, "/v1/usage-events/"+l, b.alice.APIKey, "", "").json(t)["stripe_meter_events"].([]any)
		if len(evs) != 2 || evs[0].(map[string]any)["identifier"] != "usage-log:"+id+":input" || evs[1].(map[string]any)["identifier"] != "usage-log:"+id+":output" {
			t.Fatalf("stripe identifiers of %s in a report led by %s = %v", l, id, evs)
		}
	}
	requireProblem(t, b.do(t, http.MethodGet, "/v1/usage-events/"+id, b.bob.APIKey, "", ""), http.StatusNotFound, "not-found")
	requireProblem(t, b.do(t, http.MethodGet, "/v1/usage-events/"+id, "", "", ""), http.StatusUnauthorized, "unauthorized")
	requireStatus(t, b.do(t, http.MethodGet, "/v1/usage-events/"+id, adminToken, "", ""), http.StatusOK)
	requireProblem(t, b.do(t, http.MethodGet, "/v1/usage-events/"+uuid.NewString(), b.alice.APIKey, "", ""), http.StatusNotFound, "not-found")
}

func TestDatabaseUnreachableFailsClosedAndRecovers(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	proxy, viaProxy := pgtest.NewProxy(t, dbURL)
	pc, err := pgxpool.ParseConfig(viaProxy)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := withTenants(t, apitest.StartOn(t, pool, dbURL))
	requireStatus(t, b.post(t, b.alice.APIKey, "warm", event(1, 1)), http.StatusAccepted)

	proxy.SetDown(true)
	for range 3 {
		r := b.post(t, b.alice.APIKey, "k", event(5, 5))
		requireProblem(t, r, http.StatusServiceUnavailable, "service-unavailable")
		if r.header.Get("Retry-After") == "" {
			t.Fatal("503 without Retry-After")
		}
	}
	requireStatus(t, b.do(t, http.MethodGet, "/readyz", "", "", ""), http.StatusServiceUnavailable)
	requireStatus(t, b.do(t, http.MethodGet, "/healthz", "", "", ""), http.StatusOK)

	proxy.SetDown(false)
	r := b.post(t, b.alice.APIKey, "k", event(5, 5))
	requireStatus(t, r, http.StatusAccepted)
	if r.header.Get("Idempotent-Replayed") != "" {
		t.Fatal("a 503 was stored and replayed")
	}
	requireStatus(t, b.do(t, http.MethodGet, "/readyz", "", "", ""), http.StatusOK)
}
