package finance_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/api"
	"github.com/overage-billing/overage/finance"
	"github.com/overage-billing/overage/internal/testkit/apitest"
	"github.com/overage-billing/overage/internal/testkit/worktest"
	"github.com/overage-billing/overage/tenants"
)

const adminToken = apitest.AdminToken

// env is the ingest API (for recording usage through the real ingest
// transaction) plus the finance endpoint on the same database.
type env struct {
	*apitest.Server
	financeURL string
}

func setup(t *testing.T) *env {
	t.Helper()
	s := apitest.Start(t)
	return &env{Server: s, financeURL: financeServer(t, s.Pool, adminToken)}
}

// financeServer serves the finance handler through the API's router, as
// `overage serve` mounts it.
func financeServer(t *testing.T, pool *pgxpool.Pool, token string) string {
	t.Helper()
	h := finance.NewHandler(finance.HandlerConfig{DB: pool, AdminToken: token})
	srv := httptest.NewServer(api.NewRouter(api.Config{DB: pool, Handlers: []api.Mounter{h}}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// record ingests one event through ingest.Service.Record and returns the
// new usage log's id.
func record(t testing.TB, s *apitest.Server, tenant *tenants.Created, in, out int64) uuid.UUID {
	t.Helper()
	id, err := tryRecord(context.Background(), s, tenant, in, out)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func tryRecord(ctx context.Context, s *apitest.Server, tenant *tenants.Created, in, out int64) (uuid.UUID, error) {
	return worktest.TryRecord(ctx, s.Service, tenant.ID, time.Now().Add(-time.Minute), in, out)
}

// The status changes below are the statements the report worker and the
// sweep run (workers/report_worker.go), so the counters are exercised by
// exactly the writes production makes.

// markBilled is the worker's markBilled update (pending or needs_review to
// billed).
const markBilledSQL = `UPDATE usage_logs SET
		input_accepted_at = coalesce(input_accepted_at, now()),
		output_accepted_at = coalesce(output_accepted_at, now()),
		billing_status = 'billed', billed_at = now(), billing_message = NULL, updated_at = now()
	WHERE id = $1 AND billing_status IN ('pending', 'needs_review')`

// beginSQL is the worker's first-attempt stamp, here backdated past the
// window so that parkSQL applies.
const beginSQL = `UPDATE usage_logs SET first_attempt_at = now() - interval '2 days', updated_at = now()
	WHERE id = ANY($1) AND billing_status = 'pending'`

// parkSQL is the worker's and the sweep's park (pending to needs_review).
const parkSQL = `UPDATE usage_logs SET billing_status = 'needs_review', updated_at = now(),
		billing_message = format('first sent to Stripe at %s, longer ago than Stripe''s %s idempotency window allows for a safe resend; an operator must decide',
			to_char(first_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), '24h0m0s'::text)
	WHERE id = ANY($1) AND billing_status = 'pending'
		AND first_attempt_at < now() - make_interval(secs => 77760)`

// failSQL is the worker's permanent failure (pending to failed).
const failSQL = `UPDATE usage_logs SET billing_status = 'failed', billing_message = $2, updated_at = now()
	WHERE id = $1 AND billing_status = 'pending'`

func exec(t testing.TB, db *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	tag, err := db.Exec(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tag.RowsAffected()
}

func bill(t testing.TB, db *pgxpool.Pool, id uuid.UUID) {
	t.Helper()
	if n := exec(t, db, markBilledSQL, id); n != 1 {
		t.Fatalf("mark %s billed: %d rows", id, n)
	}
}

func park(t testing.TB, db *pgxpool.Pool, ids ...uuid.UUID) {
	t.Helper()
	exec(t, db, beginSQL, ids)
	if n := exec(t, db, parkSQL, ids); n != int64(len(ids)) {
		t.Fatalf("park %v: %d rows", ids, n)
	}
}

func fail(t testing.TB, db *pgxpool.Pool, id uuid.UUID) {
	t.Helper()
	if n := exec(t, db, failSQL, id, "Stripe refused the input meter event: No such customer"); n != 1 {
		t.Fatalf("mark %s failed: %d rows", id, n)
	}
}

// oracle computes the statement straight from usage_logs with a GROUP BY —
// what the counters must always equal.
func oracle(t testing.TB, db *pgxpool.Pool) *finance.Statement {
	t.Helper()
	rows, err := db.Query(context.Background(), `
		SELECT t.id, t.name, t.stripe_customer_id,
			count(u.id),
			count(u.id) FILTER (WHERE u.billing_status = 'billed'),
			count(u.id) FILTER (WHERE u.billing_status = 'pending'),
			count(u.id) FILTER (WHERE u.billing_status = 'not_billable'),
			count(u.id) FILTER (WHERE u.billing_status = 'needs_review'),
			count(u.id) FILTER (WHERE u.billing_status = 'failed'),
			coalesce(sum(coalesce(u.overage_input_tokens, u.input_tokens)), 0)::bigint,
			coalesce(sum(coalesce(u.overage_output_tokens, u.output_tokens)), 0)::bigint,
			coalesce(sum(coalesce(u.overage_input_tokens, u.input_tokens)) FILTER (WHERE u.billing_status = 'billed'), 0)::bigint,
			coalesce(sum(coalesce(u.overage_output_tokens, u.output_tokens)) FILTER (WHERE u.billing_status = 'billed'), 0)::bigint,
			min(u.created_at) FILTER (WHERE u.billing_status = 'pending')
		FROM tenants t LEFT JOIN usage_logs u ON u.tenant_id = t.id
		GROUP BY t.id ORDER BY t.name, t.id`)
	if err != nil {
		t.Fatal(err)
	}
	r := &finance.Statement{Tenants: []finance.TenantStatus{}}
	for rows.Next() {
		var s finance.TenantStatus
		c := &s.Counters
		if err := rows.Scan(&s.TenantID, &s.Name, &s.StripeCustomerID, &c.UsageLogs, &c.Billed, &c.Pending, &c.NotBillable,
			&c.NeedsReview, &c.Failed, &c.OverageInputTokens, &c.OverageOutputTokens, &c.BilledInputTokens, &c.BilledOutputTokens,
			&c.OldestPendingAt); err != nil {
			t.Fatal(err)
		}
		r.Tenants = append(r.Tenants, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, s := range r.Tenants {
		c := s.Counters
		r.Totals.UsageLogs += c.UsageLogs
		r.Totals.Billed += c.Billed
		r.Totals.Pending += c.Pending
		r.Totals.NotBillable += c.NotBillable
		r.Totals.NeedsReview += c.NeedsReview
		r.Totals.Failed += c.Failed
		r.Totals.OverageInputTokens += c.OverageInputTokens
		r.Totals.OverageOutputTokens += c.OverageOutputTokens
		r.Totals.BilledInputTokens += c.BilledInputTokens
		r.Totals.BilledOutputTokens += c.BilledOutputTokens
		if c.OldestPendingAt != nil && (r.Totals.OldestPendingAt == nil || c.OldestPendingAt.Before(*r.Totals.OldestPendingAt)) {
			r.Totals.OldestPendingAt = c.OldestPendingAt
		}
	}
	// These tests feed only the default meters: their lines are the
	// dimension sums.
	lines := func(c *finance.Counters) {
		c.Meters = []finance.MeterCounters{
			{Meter: "input", OverageTokens: c.OverageInputTokens, BilledTokens: c.BilledInputTokens},
			{Meter: "output", OverageTokens: c.OverageOutputTokens, BilledTokens: c.BilledOutputTokens},
		}
	}
	for i := range r.Tenants {
		lines(&r.Tenants[i].Counters)
	}
	lines(&r.Totals)
	return r
}

// requireExact checks that the statement, and the counter table row by row,
// equal the GROUP BY over usage_logs.
func requireExact(t testing.TB, db *pgxpool.Pool) *finance.Statement {
	t.Helper()
	got, err := finance.Status(context.Background(), db, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := oracle(t, db)
	if !sameStatement(got, want) {
		t.Fatalf("finance.Status disagrees with a GROUP BY over usage_logs:\n got %s\nwant %s", mustJSON(t, got), mustJSON(t, want))
	}
	// Every counter row is exact too, none left over with a stale value.
	var diff int
	if err := db.QueryRow(context.Background(), `
		WITH b AS (
			SELECT tenant_id, billing_status, sum(usage_logs)::bigint AS usage_logs,
				sum(overage_input_tokens)::bigint AS overage_input_tokens, sum(overage_output_tokens)::bigint AS overage_output_tokens
			FROM billing_counters GROUP BY 1, 2
		)
		SELECT count(*) FROM (
			(SELECT tenant_id, billing_status, usage_logs, overage_input_tokens, overage_output_tokens FROM b WHERE usage_logs <> 0
			 EXCEPT SELECT tenant_id, billing_status, count(*), sum(coalesce(overage_input_tokens, input_tokens)), sum(coalesce(overage_output_tokens, output_tokens)) FROM usage_logs GROUP BY 1, 2)
			UNION ALL
			(SELECT tenant_id, billing_status, count(*), sum(coalesce(overage_input_tokens, input_tokens)), sum(coalesce(overage_output_tokens, output_tokens)) FROM usage_logs GROUP BY 1, 2
			 EXCEPT SELECT tenant_id, billing_status, usage_logs, overage_input_tokens, overage_output_tokens FROM b)
			UNION ALL
			(SELECT tenant_id, billing_status, usage_logs, overage_input_tokens, overage_output_tokens FROM b
			 WHERE usage_logs = 0 AND (overage_input_tokens <> 0 OR overage_output_tokens <> 0))
		) d`).Scan(&diff); err != nil {
		t.Fatal(err)
	}
	if diff != 0 {
		t.Fatalf("%d billing_counters rows disagree with a GROUP BY over usage_logs", diff)
	}
	return got
}

func sameStatement(a, b *finance.Statement) bool {
	norm := func(r *finance.Statement) *finance.Statement {
		c := &finance.Statement{Totals: r.Totals}
		c.Totals.OldestPendingAt = normTime(c.Totals.OldestPendingAt)
		for _, s := range r.Tenants {
			s.OldestPendingAt = normTime(s.OldestPendingAt)
			c.Tenants = append(c.Tenants, s)
		}
		return c
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

func normTime(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func tenantOf(t testing.TB, r *finance.Statement, id uuid.UUID) finance.TenantStatus {
	t.Helper()
	for _, s := range r.Tenants {
		if s.TenantID == id {
			return s
		}
	}
	t.Fatalf("tenant %s missing from the statement", id)
	return finance.TenantStatus{}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func get(t testing.TB, url, authorization string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

func requireProblem(t testing.TB, r response, status int, typ string) map[string]any {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body: %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json", ct)
	}
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("problem is not JSON: %v: %s", err, r.body)
	}
	if m["type"] != "https://overage.dev/problems/"+typ {
		t.Fatalf("problem type = %v, want %s; body: %s", m["type"], typ, r.body)
	}
	return m
}
