package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// TestTenantCommandsAndAPIManageTenantsAndKeys drives `overage tenant` and
// /v1/tenants against one server as the binary wires it: several keys per
// tenant, a revoked key refused on its next request, an allowance change
// that applies to later usage only, and no key ever shown again or logged.
func TestTenantCommandsAndAPIManageTenantsAndKeys(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	const adminToken = "admin-secret-tenants-token-0123456789abcdef"
	env := map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0", "ADMIN_TOKEN": adminToken, "LOG_LEVEL": "debug"}
	srv, logs := startServer(t, env)
	sent := 0
	call := func(method, path, bearer, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+srv.Addr()+path, strings.NewReader(body))
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		req.Header.Set("Content-Type", "application/json")
		sent++
		req.Header.Set("Idempotency-Key", fmt.Sprintf("k-%d", sent))
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return res.StatusCode, m
	}
	cli := func(args ...string) map[string]any {
		t.Helper()
		out, _, err := runCmd(t, env, args...)
		if err != nil {
			t.Fatalf("overage %s: %v", strings.Join(args, " "), err)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("overage %s printed %q, not one JSON object", strings.Join(args, " "), out)
		}
		return m
	}
	var secrets []string

	// Created by the CLI, a second key over HTTP, a third by the CLI.
	created := cli("tenant", "create", "--name", "Acme", "--stripe-customer", "cus_acme")
	id, key1 := created["id"].(string), created["api_key"].(string)
	status, k2 := call(http.MethodPost, "/v1/tenants/"+id+"/api-keys", adminToken, "")
	if status != http.StatusCreated || !strings.HasPrefix(fmt.Sprint(k2["api_key"]), "ovg_") {
		t.Fatalf("POST api-keys: %d %v", status, k2)
	}
	k3 := cli("tenant", "key", "create", id)
	secrets = append(secrets, key1, k2["api_key"].(string), k3["api_key"].(string))

	ingest := func(key string, in int) (int, map[string]any) {
		return call(http.MethodPost, "/v1/usage-events", key, fmt.Sprintf(`{"user_id":"u","model_id":"m","input_tokens":%d,"output_tokens":0}`, in))
	}
	for _, k := range secrets {
		if status, body := ingest(k, 10); status != http.StatusAccepted {
			t.Fatalf("a fresh key is refused: %d %v", status, body)
		}
	}

	// Show and list name every key by id and prefix, never the key.
	shown := cli("tenant", "show", id, "--json")
	keys, _ := shown["api_keys"].([]any)
	if len(keys) != 3 || shown["stripe_customer_id"] != "cus_acme" || shown["subscription"] != nil || shown["suspended_at"] != nil {
		t.Fatalf("tenant show: %v", shown)
	}
	out, _, err := runCmd(t, env, "tenant", "list", "--json")
	if err != nil || !strings.Contains(out, id) {
		t.Fatalf("tenant list: %q %v", out, err)
	}
	text, _, err := runCmd(t, env, "tenant", "show", id)
	if err != nil || !strings.Contains(text, k2["prefix"].(string)) {
		t.Fatalf("tenant show (text): %q %v", text, err)
	}
	status, viaHTTP := call(http.MethodGet, "/v1/tenants/"+id, adminToken, "")
	if status != http.StatusOK || len(viaHTTP["api_keys"].([]any)) != 3 {
		t.Fatalf("GET /v1/tenants/{id}: %d %v", status, viaHTTP)
	}
	status, list := call(http.MethodGet, "/v1/tenants", adminToken, "")
	listed, _ := json.Marshal(list)
	for _, s := range append(secrets, out, text, string(listed)) {
		for _, k := range secrets {
			if s != k && strings.Contains(s, k) {
				t.Fatalf("a key was shown again after its creation: %s", s)
			}
		}
	}
	if status != http.StatusOK {
		t.Fatalf("GET /v1/tenants: %d", status)
	}

	// Revoked by id: its next request is refused, the others still work.
	revoked := cli("tenant", "key", "revoke", id, k3["id"].(string))
	if revoked["revoked_at"] == nil {
		t.Fatalf("key revoke: %v", revoked)
	}
	if status, _ := ingest(k3["api_key"].(string), 10); status != http.StatusUnauthorized {
		t.Fatalf("the revoked key's next request: %d, want 401", status)
	}
	status, _ = call(http.MethodDelete, "/v1/tenants/"+id+"/api-keys/"+k2["id"].(string), adminToken, "")
	if status != http.StatusOK {
		t.Fatalf("DELETE api-keys: %d", status)
	}
	if status, _ := ingest(k2["api_key"].(string), 10); status != http.StatusUnauthorized {
		t.Fatalf("the key revoked over HTTP: %d, want 401", status)
	}
	if status, _ := ingest(key1, 10); status != http.StatusAccepted {
		t.Fatalf("the key left active: %d", status)
	}

	// An allowance change applies to what is recorded after it.
	status, before := ingest(key1, 100)
	if status != http.StatusAccepted || before["billing_status"] != "pending" {
		t.Fatalf("over a zero allowance: %d %v", status, before)
	}
	updated := cli("tenant", "update", id, "--included-input-tokens", "1000000")
	if updated["included_input_tokens"] != 1e6 || updated["name"] != "Acme" {
		t.Fatalf("tenant update: %v", updated)
	}
	if status, after := ingest(key1, 100); status != http.StatusAccepted || after["billing_status"] != "not_billable" {
		t.Fatalf("under the new allowance: %d %v", status, after)
	}
	status, again := call(http.MethodGet, "/v1/usage-events/"+before["id"].(string), adminToken, "")
	if status != http.StatusOK || again["billing_status"] != "pending" || fmt.Sprint(again["overage"]) != fmt.Sprint(before["overage"]) {
		t.Fatalf("a log recorded before the change was recomputed: %v, was %v", again, before)
	}
	status, patched := call(http.MethodPatch, "/v1/tenants/"+id, adminToken, `{"name":"Acme Corp"}`)
	if status != http.StatusOK || patched["name"] != "Acme Corp" || patched["included_input_tokens"] != 1e6 {
		t.Fatalf("PATCH: %d %v", status, patched)
	}

	// A tenant created over HTTP answers the same JSON as the CLI's.
	status, viaPost := call(http.MethodPost, "/v1/tenants", adminToken, `{"name":"Globex","stripe_customer_id":"cus_globex","included_output_tokens":5}`)
	if status != http.StatusCreated || viaPost["api_key"] == nil || viaPost["api_key_id"] == nil || viaPost["included_output_tokens"] != 5.0 {
		t.Fatalf("POST /v1/tenants: %d %v", status, viaPost)
	}
	secrets = append(secrets, viaPost["api_key"].(string))
	for k := range created {
		if _, ok := viaPost[k]; !ok {
			t.Errorf("POST /v1/tenants lacks %q of the CLI's JSON", k)
		}
	}
	if status, _ := call(http.MethodGet, "/v1/tenants", key1, ""); status != http.StatusUnauthorized {
		t.Fatalf("a tenant key on /v1/tenants: %d, want 401", status)
	}

	// The subscription period and the suspension, as the webhooks record
	// them, are shown.
	db, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(t.Context())
	for _, sql := range []string{`INSERT INTO tenant_subscriptions (tenant_id, stripe_subscription_id, status, current_period_start, current_period_end, event_created)
		VALUES ($1, 'sub_1', 'active', '2026-11-15T00:00:00Z', '2026-12-15T00:00:00Z', now())`,
		`UPDATE tenants SET suspended_at = '2026-11-20T00:00:00Z', suspended_reason = 'Stripe customer deleted; tenant suspended' WHERE id = $1`} {
		if _, err := db.Exec(t.Context(), sql, id); err != nil {
			t.Fatal(err)
		}
	}
	shown = cli("tenant", "show", id, "--json")
	sub, _ := shown["subscription"].(map[string]any)
	if sub["stripe_subscription_id"] != "sub_1" || sub["current_period_end"] != "2026-12-15T00:00:00Z" || shown["suspended_at"] != "2026-11-20T00:00:00Z" {
		t.Fatalf("tenant show with a subscription and a suspension: %v", shown)
	}
	if text, _, err := runCmd(t, env, "tenant", "show", id); err != nil || !strings.Contains(text, "sub_1 (active), period 2026-11-15T00:00:00Z to 2026-12-15T00:00:00Z") || !strings.Contains(text, "Stripe customer deleted") {
		t.Fatalf("tenant show (text): %q %v", text, err)
	}

	logged := logs.String()
	if !strings.Contains(logged, "/v1/tenants") {
		t.Fatal("no tenant request was logged: the check below would prove nothing")
	}
	for _, k := range append(secrets, adminToken) {
		if strings.Contains(logged, k) {
			t.Fatal("a key or the admin token reached the log")
		}
	}
}

// TestTenantUpdateAlerts sets a tenant's alert endpoint and thresholds
// from the CLI: the signing secret is printed once, never shown again, and
// --alert-url "" --alert-at "" remove them.
func TestTenantUpdateAlerts(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": pgtest.NewDatabase(t)}
	cli := func(args ...string) map[string]any {
		t.Helper()
		out, _, err := runCmd(t, env, args...)
		if err != nil {
			t.Fatalf("overage %s: %v", strings.Join(args, " "), err)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("overage %s printed %q, not one JSON object", strings.Join(args, " "), out)
		}
		return m
	}
	id := cli("tenant", "create", "--name", "Acme", "--stripe-customer", "cus_acme", "--included-input-tokens", "1000")["id"].(string)
	set := cli("tenant", "update", id, "--alert-url", "https://acme.example/hooks", "--alert-at", "100,80")
	secret, _ := set["alert_secret"].(string)
	if !strings.HasPrefix(secret, "whsec_") || set["alert_url"] != "https://acme.example/hooks" || fmt.Sprint(set["alert_at"]) != "[80 100]" {
		t.Fatalf("update printed %v", set)
	}
	shown := cli("tenant", "show", id, "--json")
	if shown["alert_secret"] != nil || shown["alert_url"] != "https://acme.example/hooks" {
		t.Fatalf("show printed %v", shown)
	}
	if text, _, err := runCmd(t, env, "tenant", "show", id); err != nil || !strings.Contains(text, "https://acme.example/hooks at 80%, 100%") || strings.Contains(text, secret) {
		t.Fatalf("tenant show: %v\n%s", err, text)
	}
	again := cli("tenant", "update", id, "--alert-url", "https://acme.example/v2")
	if s, _ := again["alert_secret"].(string); !strings.HasPrefix(s, "whsec_") || s == secret {
		t.Fatalf("a new URL did not issue a new secret: %v", again)
	}
	cleared := cli("tenant", "update", id, "--alert-url", "", "--alert-at", "")
	if cleared["alert_url"] != nil || fmt.Sprint(cleared["alert_at"]) != "[]" || cleared["alert_secret"] != nil {
		t.Fatalf("clearing printed %v", cleared)
	}
	for _, bad := range [][]string{{"--alert-at", "eighty"}, {"--alert-at", "0"}, {"--alert-url", "not a url"}} {
		if _, _, err := runCmd(t, env, append([]string{"tenant", "update", id}, bad...)...); err == nil {
			t.Errorf("overage tenant update %s succeeded", strings.Join(bad, " "))
		}
	}
}
