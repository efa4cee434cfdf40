package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/internal/testkit/apitest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/syncbuf"
)

// runCmd runs the binary's entry point in-process with env as its whole
// environment.
func runCmd(t *testing.T, env map[string]string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, &out, &errOut, func(k string) string { return env[k] })
	return out.String(), errOut.String(), err
}

func TestTenantCreatePrintsKeyOnceAndStoresOnlyItsHash(t *testing.T) {
	t.Parallel()
	pool, dbURL := pgtest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	out, _, err := runCmd(t, env, "tenant", "create", "--name", "Acme", "--stripe-customer", "cus_123", "--included-input-tokens", "1000")
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		ID                  string `json:"id"`
		APIKey              string `json:"api_key"`
		IncludedInputTokens int64  `json:"included_input_tokens"`
	}
	if err := json.Unmarshal([]byte(out), &created); err != nil || created.ID == "" || !strings.HasPrefix(created.APIKey, "ovg_") || created.IncludedInputTokens != 1000 {
		t.Fatalf("tenant create printed %q (%v)", out, err)
	}
	var stored int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM api_keys WHERE key_hash = sha256($1::bytea) AND position($2 in encode(key_hash, 'escape')) = 0`,
		[]byte(created.APIKey), created.APIKey).Scan(&stored); err != nil || stored != 1 {
		t.Fatalf("api key not stored as its SHA-256 (%d rows, %v)", stored, err)
	}

	_, _, err = runCmd(t, env, "tenant", "create", "--name", "", "--stripe-customer", "acme")
	if err == nil || !strings.Contains(err.Error(), "--name") || !strings.Contains(err.Error(), "--stripe-customer") {
		t.Fatalf("invalid tenant: err = %v, want both bad flags named", err)
	}
}

// TestEachCommandReadsItsOwnSettings: a malformed variable a command
// reads stops it with an error naming the variable, and one it does not
// read is not looked at (the command goes on, to a database that does not
// answer). correct, review resolve and tenant update queue a report job,
// so they read REPORT_BATCH_DELAY.
func TestEachCommandReadsItsOwnSettings(t *testing.T) {
	t.Parallel()
	// Nothing listens on port 1: the command fails at its first query.
	const deadDB = "postgres://postgres@127.0.0.1:1/overage?sslmode=disable&connect_timeout=2"
	const id = "0b0e7c2e-7d5d-4a43-9b35-6a4bb8d6b1f1"
	for _, tc := range []struct {
		args            []string
		reads, notReads string
	}{
		{[]string{"serve"}, "TENANT_MAX_INFLIGHT", "SWEEP_GRACE"},
		{[]string{"serve"}, "REPORT_BATCH_DELAY", "REPORT_WORKERS"},
		{[]string{"work"}, "SWEEP_GRACE", "TENANT_MAX_INFLIGHT"},
		{[]string{"work"}, "REPORT_BATCH_DELAY", "INGEST_COALESCE"},
		{[]string{"correct", id, "--input-tokens", "1", "--output-tokens", "1", "--reason", "r"}, "REPORT_BATCH_DELAY", "SWEEP_GRACE"},
		{[]string{"correct", id, "--input-tokens", "1", "--output-tokens", "1", "--reason", "r"}, "PERIOD_CLOSE_GRACE", "STRIPE_IDEMPOTENCY_WINDOW"},
		{[]string{"review", "resolve", id, "--as", "void", "--reason", "r"}, "REPORT_BATCH_DELAY", "TENANT_MAX_INFLIGHT"},
		{[]string{"review", "resolve", id, "--as", "void", "--reason", "r"}, "STRIPE_IDEMPOTENCY_WINDOW", "SWEEP_GRACE"},
		{[]string{"tenant", "update", id, "--name", "n"}, "REPORT_BATCH_DELAY", "SWEEP_GRACE"},
		{[]string{"tenant", "update", id, "--name", "n"}, "STRIPE_API_BASE", "LOG_LEVEL"},
		{[]string{"tenant", "list"}, "", "REPORT_BATCH_DELAY"},
		{[]string{"review", "list"}, "", "REPORT_BATCH_DELAY"},
		{[]string{"status"}, "", "STRIPE_API_BASE"},
		{[]string{"meter", "list"}, "", "REPORT_MAX_ATTEMPTS"},
		{[]string{"migrate"}, "", "LOG_LEVEL"},
		{[]string{"reconcile", "--from", "2026-01-01", "--to", "2026-01-02"}, "LOG_LEVEL", "REPORT_BATCH_DELAY"},
		{[]string{"retention", "--dry-run"}, "USAGE_LOG_RETENTION", "SWEEP_GRACE"},
		{[]string{"retention"}, "PERIOD_CLOSE_GRACE", "STRIPE_API_BASE"},
		{[]string{"work"}, "USAGE_LOG_RETENTION", "INGEST_COALESCE"},
	} {
		malformed := map[string]string{"TENANT_MAX_INFLIGHT": "eight", "SWEEP_GRACE": "ten minutes", "REPORT_BATCH_DELAY": "a second",
			"REPORT_WORKERS": "-1", "INGEST_COALESCE": "-1", "PERIOD_CLOSE_GRACE": "an hour", "STRIPE_IDEMPOTENCY_WINDOW": "48h",
			"STRIPE_API_BASE": "localhost", "LOG_LEVEL": "loud", "REPORT_MAX_ATTEMPTS": "five", "USAGE_LOG_RETENTION": "a year"}
		base := map[string]string{"DATABASE_URL": deadDB, "LISTEN_ADDR": "127.0.0.1:0", "STRIPE_SECRET_KEY": "sk_test_x"}
		with := func(name string) map[string]string {
			env := map[string]string{name: malformed[name]}
			for k, v := range base {
				env[k] = v
			}
			return env
		}
		if tc.reads != "" {
			_, _, err := runCmd(t, with(tc.reads), tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.reads+"=") {
				t.Errorf("%v with %s=%q: %v, want an error naming it", tc.args, tc.reads, malformed[tc.reads], err)
			}
		}
		_, _, err := runCmd(t, with(tc.notReads), tc.args...)
		if err == nil || strings.Contains(err.Error(), tc.notReads) || !strings.Contains(err.Error(), "PostgreSQL") {
			t.Errorf("%v with %s=%q, which it does not read: %v, want it to go on to the database", tc.args, tc.notReads, malformed[tc.notReads], err)
		}
	}
}

// TestHelpListsTheVariablesACommandReads: a command's --help lists the
// variables it reads, from what it reads, and no others.
func TestHelpListsTheVariablesACommandReads(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args         []string
		lists, omits string
	}{
		{[]string{"serve", "--help"}, "TENANT_MAX_INFLIGHT", "SWEEP_GRACE"},
		{[]string{"work", "--help"}, "PERIOD_CLOSE_GRACE", "TENANT_MAX_INFLIGHT"},
		{[]string{"work", "--help"}, "REPORT_BATCH_DELAY", "ADMIN_TOKEN"},
		{[]string{"tenant", "list", "--help"}, "DATABASE_URL", "REPORT_BATCH_DELAY"},
		{[]string{"retention", "--help"}, "USAGE_LOG_RETENTION", "REPORT_BATCH_DELAY"},
	} {
		out, _, err := runCmd(t, nil, tc.args...)
		_, vars, _ := strings.Cut(out, "\nEnvironment")
		if (err != nil && !errors.Is(err, flag.ErrHelp)) || !strings.Contains(vars, tc.lists) || strings.Contains(vars, tc.omits) {
			t.Errorf("%v lists %q (%v): want %s and not %s", tc.args, vars, err, tc.lists, tc.omits)
		}
	}
}

func TestHelpAndUnknownCommand(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"serve", "--help"}, {"migrate", "--help"}, {"work", "--help"}, {"tenant", "--help"}, {"tenant", "create", "--help"}, {"dev", "--help"}} {
		out, _, err := runCmd(t, nil, args...)
		if (err != nil && !strings.Contains(err.Error(), "help requested")) || !strings.Contains(out, "overage") && !strings.Contains(out, "Usage") {
			t.Errorf("%v: out=%q err=%v", args, out, err)
		}
	}
	if _, _, err := runCmd(t, nil, "bill-everyone"); err == nil {
		t.Error("unknown command accepted")
	}
}

// TestServeEndToEnd runs `overage migrate`, `tenant create` and the server
// as the binary wires them, on port 0, and records and replays an event.
func TestServeEndToEnd(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	const adminToken = "admin-secret-e2e-token-0123456789abcdef"
	env := map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0", "ADMIN_TOKEN": adminToken,
		"STRIPE_SECRET_KEY": "sk_test_e2esecretkey", "STRIPE_WEBHOOK_SECRET": "whsec_e2esecret", "LOG_LEVEL": "debug"}
	if out, _, err := runCmd(t, env, "migrate"); err != nil || !strings.Contains(out, "0 overage") {
		t.Fatalf("migrate on a migrated database: %q %v", out, err)
	}
	out, _, err := runCmd(t, env, "tenant", "create", "--name", "Acme", "--stripe-customer", "cus_1")
	if err != nil {
		t.Fatal(err)
	}
	var tenant struct {
		APIKey string `json:"api_key"`
	}
	if err := json.Unmarshal([]byte(out), &tenant); err != nil {
		t.Fatal(err)
	}

	srv, logs := startServer(t, env)

	post := func() (int, string, http.Header) {
		req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://%s/v1/usage-events", srv.Addr()),
			strings.NewReader(`{"user_id":"u","model_id":"m","input_tokens":10,"output_tokens":1}`))
		req.Header.Set("Authorization", "Bearer "+tenant.APIKey)
		req.Header.Set("Idempotency-Key", "e2e-1")
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b), res.Header
	}
	s1, b1, _ := post()
	s2, b2, h2 := post()
	if s1 != http.StatusAccepted || s2 != http.StatusAccepted || b1 != b2 || h2.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d %s; second %d %s", s1, b1, s2, b2)
	}
	get := func(path, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+srv.Addr()+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if status, _ := get(path, ""); status != http.StatusOK {
			t.Fatalf("%s: %d", path, status)
		}
	}

	// Metrics moved with the two requests: one new event, one replay, and
	// the new log is pending.
	status, body := get("/metrics", "")
	for _, want := range []string{`overage_ingest_requests_total{outcome="new"} 1`, `overage_ingest_requests_total{outcome="replay"} 1`,
		`overage_ingest_duration_seconds_count{outcome="new"} 1`, "overage_pending_usage_logs 1", "overage_backlog_scrape_ok 1"} {
		if status != http.StatusOK || !strings.Contains(body, want) {
			t.Fatalf("/metrics (%d) lacks %q", status, want)
		}
	}

	// River UI is an operator tool: the admin token or nothing.
	if status, _ := get("/riverui/", ""); status != http.StatusUnauthorized {
		t.Fatalf("/riverui without the admin token: %d, want 401", status)
	}
	if status, _ := get("/riverui/", tenant.APIKey); status != http.StatusUnauthorized {
		t.Fatalf("/riverui with a tenant key: %d, want 401", status)
	}
	if status, _ := get("/riverui/api/jobs?state=available", adminToken); status != http.StatusOK {
		t.Fatalf("/riverui with the admin token: %d, want 200", status)
	}
	if status, _ := get("/v1/usage-events/"+mustID(t, b1), adminToken); status != http.StatusOK {
		t.Fatalf("admin read of a usage log: %d", status)
	}

	// A key made over HTTP is in its answer only.
	req, _ := http.NewRequest(http.MethodPost, "http://"+srv.Addr()+"/v1/tenants", strings.NewReader(`{"name":"Globex","stripe_customer_id":"cus_2"}`))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	res, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var viaHTTP struct {
		APIKey string `json:"api_key"`
	}
	if err := json.NewDecoder(res.Body).Decode(&viaHTTP); err != nil || res.StatusCode != http.StatusCreated || viaHTTP.APIKey == "" {
		t.Fatalf("POST /v1/tenants: %d %v", res.StatusCode, err)
	}
	res.Body.Close()

	// Secrets never reach a log line, even at debug level.
	logged := logs.String()
	if !strings.Contains(logged, "http request") {
		t.Fatal("no request was logged: the check below would prove nothing")
	}
	for name, secret := range map[string]string{"API key": tenant.APIKey, "API key made over HTTP": viaHTTP.APIKey, "admin token": adminToken,
		"Stripe key": env["STRIPE_SECRET_KEY"], "webhook secret": env["STRIPE_WEBHOOK_SECRET"]} {
		if strings.Contains(logged, secret) {
			t.Fatalf("the %s reached the log", name)
		}
	}
}

func mustID(t *testing.T, body string) string {
	t.Helper()
	var v struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.ID == "" {
		t.Fatalf("no id in %s", body)
	}
	return v.ID
}

// startServer runs `overage serve` as the binary wires it, configured by
// env, until the test ends, and returns it with its log.
func startServer(t *testing.T, env map[string]string) (*app.Server, *syncbuf.Buffer) {
	t.Helper()
	var cfg app.ServeConfig
	if err := cfg.Read(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	srv, err := app.NewServer(context.Background(), &cfg, app.NewLogger(logs, cfg.Log.Level))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close) // after RunUntilCleanup's shutdown: cleanups run last-in first-out
	apitest.RunUntilCleanup(t, srv)
	return srv, logs
}
