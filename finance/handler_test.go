package finance_test

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/finance"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// The counters every tenant line and the totals carry, as the API documents them.
var counterFields = []string{"usage_logs", "billed", "pending", "not_billable", "needs_review", "failed",
	"overage_input_tokens", "overage_output_tokens", "billed_input_tokens", "billed_output_tokens", "oldest_pending_at", "meters"}

func TestHTTPStatusAnswersTheSpecShape(t *testing.T) {
	t.Parallel()
	e := setup(t)
	alice := e.Tenant(t, "alice", 0, 0)
	e.Tenant(t, "idle", 0, 0)
	bill(t, e.Pool, record(t, e.Server, alice, 120, 30))
	record(t, e.Server, alice, 5, 0)

	r := get(t, e.financeURL+"/v1/billing/status", "Bearer "+adminToken)
	if r.status != http.StatusOK || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, Content-Type %q: %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	if cc := r.header.Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("Cache-Control = %q, want no-store", cc)
	}
	var raw struct {
		Tenants []map[string]json.RawMessage `json:"tenants"`
		Totals  map[string]json.RawMessage   `json:"totals"`
	}
	if err := json.Unmarshal(r.body, &raw); err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	_ = json.Unmarshal(r.body, &top)
	// Every tenant fits one page: next_cursor is null.
	if len(top) != 3 || string(top["next_cursor"]) != "null" {
		t.Fatalf("top-level keys = %v (next_cursor %s), want tenants, totals and a null next_cursor", keys(top), top["next_cursor"])
	}
	wantTenant := append([]string{"tenant_id", "name", "stripe_customer_id"}, counterFields...)
	for _, tn := range raw.Tenants {
		if got := keys(tn); !slices.Equal(got, sorted(wantTenant)) {
			t.Fatalf("tenant keys = %v, want %v", got, sorted(wantTenant))
		}
	}
	if got := keys(raw.Totals); !slices.Equal(got, sorted(counterFields)) {
		t.Fatalf("totals keys = %v, want %v", got, sorted(counterFields))
	}
	if len(raw.Tenants) != 2 || string(raw.Tenants[1]["oldest_pending_at"]) != "null" || string(raw.Tenants[1]["usage_logs"]) != "0" {
		t.Fatalf("idle tenant must appear with zeros and a null oldest_pending_at: %s", r.body)
	}

	var st finance.Statement
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatal(err)
	}
	if !sameStatement(&st, oracle(t, e.Pool)) {
		t.Fatalf("HTTP statement %s disagrees with usage_logs %s", r.body, mustJSON(t, oracle(t, e.Pool)))
	}
	if st.Totals.Billed != 1 || st.Totals.Pending != 1 || st.Totals.BilledInputTokens != 120 || st.Totals.OverageInputTokens != 125 || st.Totals.OldestPendingAt == nil {
		t.Fatalf("totals = %s", mustJSON(t, st.Totals))
	}

	// One tenant.
	r = get(t, e.financeURL+"/v1/billing/status?tenant_id="+alice.ID.String(), "Bearer "+adminToken)
	if err := json.Unmarshal(r.body, &st); err != nil || r.status != http.StatusOK {
		t.Fatalf("status %d: %s (%v)", r.status, r.body, err)
	}
	if len(st.Tenants) != 1 || st.Tenants[0].TenantID != alice.ID || st.Totals.UsageLogs != 2 {
		t.Fatalf("tenant filter: %s", r.body)
	}

	// An unknown tenant, a malformed one.
	requireProblem(t, get(t, e.financeURL+"/v1/billing/status?tenant_id=0190c3f0-0000-7000-8000-000000000000", "Bearer "+adminToken),
		http.StatusNotFound, "not-found")
	p := requireProblem(t, get(t, e.financeURL+"/v1/billing/status?tenant_id=alice", "Bearer "+adminToken),
		http.StatusBadRequest, "malformed-request")
	if errs, _ := p["errors"].([]any); len(errs) != 1 || errs[0].(map[string]any)["field"] != "tenant_id" {
		t.Fatalf("a malformed tenant_id must be named: %v", p)
	}
	requireProblem(t, get(t, e.financeURL+"/v1/billing/status?tenant_id=", "Bearer "+adminToken),
		http.StatusBadRequest, "malformed-request")
}

func TestHTTPStatusRefusesWithoutTheAdminToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	url := e.financeURL + "/v1/billing/status"
	for _, auth := range []string{
		"",
		"Bearer",
		"Bearer ",
		"Bearer wrong-token",
		"Bearer " + adminToken + "x",
		"Bearer " + adminToken[:len(adminToken)-1],
		"Basic " + adminToken,
		adminToken,
	} {
		r := get(t, url, auth)
		requireProblem(t, r, http.StatusUnauthorized, "unauthorized")
		if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("401 without WWW-Authenticate: Bearer (Authorization %q)", auth)
		}
		if strings.Contains(string(r.body), "tenants") {
			t.Fatalf("refused request leaked data: %s", r.body)
		}
	}
	// The scheme is case-insensitive (RFC 9110).
	if r := get(t, url, "bearer "+adminToken); r.status != http.StatusOK {
		t.Fatalf("lower-case scheme: %d %s", r.status, r.body)
	}

	// Without ADMIN_TOKEN configured the endpoint refuses everyone,
	// including an empty or the test token.
	closed := financeServer(t, e.Pool, "")
	for _, auth := range []string{"", "Bearer ", "Bearer " + adminToken} {
		requireProblem(t, get(t, closed+"/v1/billing/status", auth), http.StatusUnauthorized, "unauthorized")
	}
}

func TestHTTPStatusIs503WhenTheDatabaseIsDown(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	proxy, viaProxy := pgtest.NewProxy(t, dbURL)
	pool, err := pgxpool.New(context.Background(), viaProxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	url := financeServer(t, pool, adminToken) + "/v1/billing/status"
	if r := get(t, url, "Bearer "+adminToken); r.status != http.StatusOK {
		t.Fatalf("before the cut: %d %s", r.status, r.body)
	}
	proxy.SetDown(true)
	r := get(t, url, "Bearer "+adminToken)
	requireProblem(t, r, http.StatusServiceUnavailable, "service-unavailable")
	if r.header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	proxy.SetDown(false)
	if r := get(t, url, "Bearer "+adminToken); r.status != http.StatusOK {
		t.Fatalf("after the database is back: %d %s", r.status, r.body)
	}
}

func TestWriteTableShowsTheNumbersAligned(t *testing.T) {
	t.Parallel()
	e := setup(t)
	alice := e.Tenant(t, "alice", 0, 0)
	e.Tenant(t, "zeta-tenant-with-a-long-name", 0, 0)
	bill(t, e.Pool, record(t, e.Server, alice, 1234, 567))
	park(t, e.Pool, record(t, e.Server, alice, 89, 0))
	record(t, e.Server, alice, 4321, 0)

	rep, err := finance.Status(context.Background(), e.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	if err := finance.WriteTable(&sb, rep); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	lines := strings.Split(out, "\n")
	if len(lines) < 4 {
		t.Fatalf("table:\n%s", out)
	}
	header, aliceLine, total := lines[0], lines[1], lines[3]
	for _, col := range []string{"TENANT", "BILLED", "PENDING", "NOT BILLABLE", "NEEDS REVIEW", "FAILED", "OVERAGE IN", "BILLED OUT", "OLDEST PENDING"} {
		if !strings.Contains(header, col) {
			t.Fatalf("header lacks %q:\n%s", col, out)
		}
	}
	// alice: 3 logs, 1 billed, 1 pending, 0 not billable, 1 in review, 0
	// failed; overage 5644 in, 567 out; billed 1234 in, 567 out.
	fields := strings.Fields(aliceLine)
	wantAlice := []string{"alice", alice.ID.String(), "cus_alice", "3", "1", "1", "0", "1", "0", "5644", "567", "1234", "567"}
	if !slices.Equal(fields[:len(wantAlice)], wantAlice) {
		t.Fatalf("alice line = %q, want it to start %q\n%s", fields, wantAlice, out)
	}
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`).MatchString(fields[len(fields)-1]) {
		t.Fatalf("alice's oldest pending = %q, want a UTC time", fields[len(fields)-1])
	}
	if f := strings.Fields(total); f[0] != "TOTAL" || f[1] != "3" || f[len(f)-1] == "-" {
		t.Fatalf("totals line = %q", total)
	}
	if f := strings.Fields(lines[2]); f[0] != "zeta-tenant-with-a-long-name" || f[3] != "0" || f[len(f)-1] != "-" {
		t.Fatalf("idle tenant line = %q", lines[2])
	}
	// Aligned: every number column ends at the same offset on every line
	// (AlignRight), so the header, alice and TOTAL are equally long.
	if len(header) != len(aliceLine) || len(header) != len(total) {
		t.Fatalf("lines are not aligned:\n%s", out)
	}
	if i := strings.Index(header, "LOGS") + len("LOGS"); aliceLine[i-1:i] != "3" || total[i-1:i] != "3" {
		t.Fatalf("LOGS column not right-aligned under its header:\n%s", out)
	}
	if !strings.Contains(out, "1 usage log(s) need review") {
		t.Fatalf("no review notice:\n%s", out)
	}
}

func keys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	return out
}
