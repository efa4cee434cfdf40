package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// TestMeterCommandsAndAPIManageTheCatalog drives `overage meter` and
// /v1/meters against one server as the binary wires it: the defaults named
// by STRIPE_METER_*_EVENT, a meter created by the CLI seen over HTTP and
// the other way round, the same pattern twice refused with 409 (exit 1 and
// one line from the CLI), archive idempotent and refused for a default,
// and allowances per meter with --included and "included".
func TestMeterCommandsAndAPIManageTheCatalog(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	const adminToken = "admin-secret-meters-token-0123456789abcdef"
	env := map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0", "ADMIN_TOKEN": adminToken,
		"STRIPE_METER_INPUT_EVENT": "llm_in", "STRIPE_METER_OUTPUT_EVENT": "llm_out"}
	srv, _ := startServer(t, env)
	call := func(method, path, bearer, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+srv.Addr()+path, strings.NewReader(body))
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s %s answered %d %q, not a JSON object", method, path, res.StatusCode, b)
		}
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
	// fails runs a command that must fail and returns its exit status and
	// what main would print.
	fails := func(args ...string) (int, string) {
		t.Helper()
		_, _, err := runCmd(t, env, args...)
		if err == nil {
			t.Fatalf("overage %s succeeded, want a failure", strings.Join(args, " "))
		}
		var stderr strings.Builder
		code := exitStatus(&stderr, err)
		return code, stderr.String()
	}

	listed := cli("meter", "list", "--json")
	ms, _ := listed["meters"].([]any)
	if len(ms) != 2 {
		t.Fatalf("meter list --json: %v, want the two defaults", listed)
	}
	if in := ms[0].(map[string]any); in["key"] != "input" || in["event_name"] != "llm_in" || in["token_type"] != "input" ||
		fmt.Sprint(in["models"]) != "[*]" || in["archived_at"] != nil || in["created_at"] == nil {
		t.Fatalf("the default input meter: %v", in)
	}
	if ms[1].(map[string]any)["event_name"] != "llm_out" {
		t.Fatalf("the default output meter: %v", ms[1])
	}

	created := cli("meter", "create", "--key", "gpt4o_input", "--event-name", "gpt4o_in", "--token-type", "input",
		"--models", "gpt-4o, gpt-4o-2024-*")
	if created["key"] != "gpt4o_input" || fmt.Sprint(created["models"]) != "[gpt-4o gpt-4o-2024-*]" || created["archived_at"] != nil {
		t.Fatalf("meter create: %v", created)
	}
	status, viaHTTP := call(http.MethodPost, "/v1/meters", adminToken, `{"key":"cache_reads","event_name":"cached_in","token_type":"cache_read"}`)
	if status != http.StatusCreated || fmt.Sprint(viaHTTP["models"]) != "[*]" || viaHTTP["event_name"] != "cached_in" {
		t.Fatalf("POST /v1/meters: %d %v", status, viaHTTP)
	}
	for k := range created {
		if _, ok := viaHTTP[k]; !ok {
			t.Errorf("POST /v1/meters lacks %q of the CLI's JSON", k)
		}
	}
	status, all := call(http.MethodGet, "/v1/meters", adminToken, "")
	if status != http.StatusOK || len(all["meters"].([]any)) != 4 {
		t.Fatalf("GET /v1/meters: %d %v", status, all)
	}
	text, _, err := runCmd(t, env, "meter", "list")
	if err != nil || !strings.Contains(text, "gpt4o_input") || !strings.Contains(text, "gpt-4o,gpt-4o-2024-*") || !strings.Contains(text, "llm_in") {
		t.Fatalf("meter list: %q %v", text, err)
	}

	// The same pattern twice: 409 over HTTP, exit 1 and one line from the CLI.
	status, problem := call(http.MethodPost, "/v1/meters", adminToken, `{"key":"gpt4o_again","event_name":"x","token_type":"input","models":["gpt-4o"]}`)
	if status != http.StatusConflict || problem["type"] != "https://overage.dev/problems/meter-exists" {
		t.Fatalf("the same pattern twice over HTTP: %d %v", status, problem)
	}
	code, line := fails("meter", "create", "--key", "gpt4o_again", "--event-name", "x", "--token-type", "input", "--models", "gpt-4o")
	if code != 1 || strings.Count(line, "\n") != 1 || !strings.Contains(line, "already has one of the patterns gpt-4o") {
		t.Fatalf("the same pattern twice from the CLI: exit %d, %q", code, line)
	}
	// A bad flag names the flag; a missing one is a usage error (2).
	code, line = fails("meter", "create", "--key", "Bad Key", "--event-name", "x", "--token-type", "tokens")
	if code != 1 || !strings.Contains(line, "--key must be") || !strings.Contains(line, "--token-type must be one of") {
		t.Fatalf("bad flags: exit %d, %q", code, line)
	}
	if code, line = fails("meter", "create", "--key", "k"); code != 2 || !strings.Contains(line, "--event-name, --token-type") {
		t.Fatalf("missing flags: exit %d, %q", code, line)
	}
	if code, _ = fails("meter", "frobnicate"); code != 2 {
		t.Fatalf("an unknown meter command: exit %d, want 2", code)
	}
	if code, line = fails("meter", "archive"); code != 2 || !strings.Contains(line, "missing KEY") {
		t.Fatalf("archive without a key: exit %d, %q", code, line)
	}
	if out, _, err := runCmd(t, env, "meter", "create", "--help"); exitStatus(io.Discard, err) != 0 || !strings.Contains(out, "-models") {
		t.Fatalf("meter create --help: %q %v", out, err)
	}
	if out, _, err := runCmd(t, env, "meter", "--help"); err != nil || !strings.Contains(out, "cannot be archived") {
		t.Fatalf("meter --help: %q %v", out, err)
	}

	// Allowances per meter, by flag and by JSON.
	tenant := cli("tenant", "create", "--name", "Acme", "--stripe-customer", "cus_acme",
		"--included", "gpt4o_input=1000", "--included-output-tokens", "20", "--included", "input=5")
	id := tenant["id"].(string)
	if fmt.Sprint(tenant["included"]) != "map[gpt4o_input:1000 input:5 output:20]" || tenant["included_input_tokens"] != 5.0 {
		t.Fatalf("tenant create --included: %v", tenant)
	}
	updated := cli("tenant", "update", id, "--included", "cache_reads=300", "--included", "gpt4o_input=0")
	if fmt.Sprint(updated["included"]) != "map[cache_reads:300 input:5 output:20]" {
		t.Fatalf("tenant update --included: %v", updated)
	}
	status, patched := call(http.MethodPatch, "/v1/tenants/"+id, adminToken, `{"included":{"output":25,"gpt4o_input":7}}`)
	if status != http.StatusOK || fmt.Sprint(patched["included"]) != "map[cache_reads:300 gpt4o_input:7 input:5 output:25]" ||
		patched["included_output_tokens"] != 25.0 {
		t.Fatalf("PATCH included: %d %v", status, patched)
	}
	status, problem = call(http.MethodPatch, "/v1/tenants/"+id, adminToken, `{"included":{"no_such_meter":7}}`)
	if status != http.StatusUnprocessableEntity || !strings.Contains(fmt.Sprint(problem["errors"]), "included.no_such_meter") {
		t.Fatalf("PATCH an unknown meter: %d %v", status, problem)
	}
	code, line = fails("tenant", "update", id, "--included", "no_such_meter=1")
	if code != 1 || !strings.Contains(line, "--included no_such_meter=N: names no meter") {
		t.Fatalf("tenant update of an unknown meter: exit %d, %q", code, line)
	}
	for _, args := range [][]string{
		{"tenant", "update", id, "--included", "gpt4o_input"},
		{"tenant", "update", id, "--included", "gpt4o_input=lots"},
		{"tenant", "update", id, "--included-input-tokens", "5", "--included", "input=6"},
	} {
		if code, line := fails(args...); code != 2 {
			t.Errorf("overage %s: exit %d (%q), want a usage error", strings.Join(args, " "), code, line)
		}
	}
	status, viaPost := call(http.MethodPost, "/v1/tenants", adminToken,
		`{"name":"Globex","stripe_customer_id":"cus_globex","included_input_tokens":9,"included":{"cache_reads":4}}`)
	if status != http.StatusCreated || fmt.Sprint(viaPost["included"]) != "map[cache_reads:4 input:9 output:0]" {
		t.Fatalf("POST /v1/tenants with included: %d %v", status, viaPost)
	}
	shown, _, err := runCmd(t, env, "tenant", "show", id)
	if err != nil || !strings.Contains(shown, "5 input, 25 output, cache_reads=300, gpt4o_input=7 per period") {
		t.Fatalf("tenant show: %q %v", shown, err)
	}
	if list, _, err := runCmd(t, env, "tenant", "list"); err != nil || !strings.Contains(list, "cache_reads=300,gpt4o_input=7") {
		t.Fatalf("tenant list: %q %v", list, err)
	}

	// Archive: over HTTP, again by the CLI (the same answer), a default
	// refused, an unknown one not found.
	status, archived := call(http.MethodDelete, "/v1/meters/gpt4o_input", adminToken, "")
	if status != http.StatusOK || archived["archived_at"] == nil {
		t.Fatalf("DELETE /v1/meters/gpt4o_input: %d %v", status, archived)
	}
	again := cli("meter", "archive", "gpt4o_input")
	if again["archived_at"] != archived["archived_at"] {
		t.Fatalf("archive again: %v, want the first archive's %v", again["archived_at"], archived["archived_at"])
	}
	if status, p := call(http.MethodDelete, "/v1/meters/input", adminToken, ""); status != http.StatusUnprocessableEntity {
		t.Fatalf("archive a default over HTTP: %d %v", status, p)
	}
	if code, line := fails("meter", "archive", "output"); code != 1 || !strings.Contains(line, "cannot be archived") {
		t.Fatalf("archive a default from the CLI: exit %d, %q", code, line)
	}
	if status, _ := call(http.MethodDelete, "/v1/meters/nope", adminToken, ""); status != http.StatusNotFound {
		t.Fatalf("archive an unknown meter: %d", status)
	}
	// Its pattern is free again.
	cli("meter", "create", "--key", "gpt4o_input_v2", "--event-name", "gpt4o_in_v2", "--token-type", "input", "--models", "gpt-4o")

	// Admin only.
	for _, bearer := range []string{"", "not-the-admin-token", tenant["api_key"].(string)} {
		if status, _ := call(http.MethodGet, "/v1/meters", bearer, ""); status != http.StatusUnauthorized {
			t.Fatalf("GET /v1/meters with %q: %d, want 401", bearer, status)
		}
	}
	if _, _, err := runCmd(t, map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2"},
		"meter", "list"); err == nil || !strings.Contains(err.Error(), "cannot reach PostgreSQL") {
		t.Fatalf("meter list without a database: %v", err)
	}
}
