package api_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/overage-billing/overage/internal/testkit/apitest"
)

// TestMeterAPIConformsToOpenAPI exercises every documented status of the
// /v1/meters operations against the real server and validates each
// request and answer against api/openapi.yaml.
func TestMeterAPIConformsToOpenAPI(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	admin := func(method, path, body string) func(f *fixture) call {
		return func(f *fixture) call { return jsonCall(method, path, body) }
	}
	meterKeys := func(t *testing.T, r *result) []string {
		var keys []string
		for _, m := range r.json(t)["meters"].([]any) {
			keys = append(keys, m.(map[string]any)["key"].(string))
		}
		return keys
	}

	cases := []apiCase{
		{name: "200 list meters: the defaults", status: 200, req: admin(http.MethodGet, "/v1/meters", ""),
			check: func(t *testing.T, f *fixture, r *result) {
				if got := meterKeys(t, r); !slices.Equal(got, []string{"input", "output"}) {
					t.Fatalf("meters %v: %s", got, r.body)
				}
			}},
		{name: "201 create meter", status: 201,
			req: admin(http.MethodPost, "/v1/meters", `{"key":"gpt4o_input","event_name":"gpt4o_in","token_type":"input","models":["gpt-4o","gpt-4o-2024-*"]}`),
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); m["key"] != "gpt4o_input" || m["archived_at"] != nil {
					t.Fatalf("created: %s", r.body)
				}
			}},
		{name: "201 create meter of every model", status: 201,
			req: admin(http.MethodPost, "/v1/meters", `{"key":"cache_reads","event_name":"cached_in","token_type":"cache_read"}`),
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); fmt.Sprint(m["models"]) != "[*]" {
					t.Fatalf("created: %s", r.body)
				}
			}},
		{name: "409 create meter, a pattern taken", status: 409, problem: "meter-exists",
			req: admin(http.MethodPost, "/v1/meters", `{"key":"gpt4o_again","event_name":"x","token_type":"input","models":["claude-*","gpt-4o"]}`)},
		{name: "409 create meter, its key taken", status: 409, problem: "meter-exists",
			req: admin(http.MethodPost, "/v1/meters", `{"key":"gpt4o_input","event_name":"x","token_type":"output","models":["zzz"]}`)},
		{name: "400 create meter, unknown field", status: 400, problem: "malformed-request", field: "body", docRefuses: true,
			req: admin(http.MethodPost, "/v1/meters", `{"key":"k","event_name":"e","token_type":"input","model":"gpt-4o"}`)},
		{name: "422 create meter, bad fields", status: 422, problem: "validation-failed", field: "token_type", docRefuses: true,
			req: admin(http.MethodPost, "/v1/meters", `{"key":"Bad Key","event_name":"e","token_type":"cached","models":["a*b"]}`),
			check: func(t *testing.T, f *fixture, r *result) {
				for _, field := range []string{`"key"`, `"models"`} {
					if !strings.Contains(string(r.body), `"field":`+field) {
						t.Errorf("the problem does not name %s: %s", field, r.body)
					}
				}
			}},
		{name: "422 create meter, a NUL in the event name", status: 422, problem: "validation-failed", field: "event_name",
			req: admin(http.MethodPost, "/v1/meters", `{"key":"k","event_name":"e\u0000","token_type":"input"}`)},
		{name: "422 create meter, a default's key", status: 422, problem: "validation-failed", field: "key",
			req: admin(http.MethodPost, "/v1/meters", `{"key":"input","event_name":"e","token_type":"input","models":["x"]}`)},
		{name: "413 create meter over 64 KiB", status: 413, problem: "payload-too-large",
			req: admin(http.MethodPost, "/v1/meters", `{"key":"k","event_name":"e","token_type":"input"`+strings.Repeat(" ", 65<<10)+`}`)},
		{name: "401 create meter without token", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return call{method: http.MethodPost, path: "/v1/meters", body: `{}`} }},
		{name: "401 list meters with a tenant key", status: 401, problem: "unauthorized",
			req: func(f *fixture) call { return get("/v1/meters", f.alice.APIKey) }},

		{name: "200 archive meter", status: 200, req: admin(http.MethodDelete, "/v1/meters/gpt4o_input", ""),
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); m["archived_at"] == nil {
					t.Fatalf("archived: %s", r.body)
				}
			}},
		{name: "200 archive it again", status: 200, req: admin(http.MethodDelete, "/v1/meters/gpt4o_input", "")},
		{name: "201 its pattern is free again", status: 201,
			req: admin(http.MethodPost, "/v1/meters", `{"key":"gpt4o_input_v2","event_name":"gpt4o_in_v2","token_type":"input","models":["gpt-4o"]}`)},
		{name: "200 list meters: archived ones too, by key", status: 200, req: admin(http.MethodGet, "/v1/meters", ""),
			check: func(t *testing.T, f *fixture, r *result) {
				if got := meterKeys(t, r); !slices.Equal(got, []string{"cache_reads", "gpt4o_input", "gpt4o_input_v2", "input", "output"}) {
					t.Fatalf("meters %v", got)
				}
			}},
		{name: "422 archive a default meter", status: 422, problem: "validation-failed", field: "key",
			req: admin(http.MethodDelete, "/v1/meters/output", "")},
		{name: "404 archive an unknown meter", status: 404, problem: "not-found", req: admin(http.MethodDelete, "/v1/meters/nope", "")},
		{name: "401 archive without token", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return call{method: http.MethodDelete, path: "/v1/meters/cache_reads"} }},
		{name: "405 PUT /v1/meters carries Allow", status: 405, problem: "method-not-allowed", undocumented: "MethodNotAllowed",
			req: admin(http.MethodPut, "/v1/meters", ""),
			check: func(t *testing.T, f *fixture, r *result) {
				if got := strings.Join(r.header.Values("Allow"), ", "); got != "GET, POST" {
					t.Fatalf("Allow = %q, want GET, POST", got)
				}
			}},
	}
	// Every operation, with the tables renamed away (500) and with the
	// database down (503).
	ops := []func(f *fixture) call{
		admin(http.MethodPost, "/v1/meters", `{"key":"later","event_name":"e","token_type":"reasoning"}`),
		admin(http.MethodGet, "/v1/meters", ""),
		admin(http.MethodDelete, "/v1/meters/cache_reads", ""),
	}
	for i, op := range ops {
		c := apiCase{name: fmt.Sprintf("500 meter operation %d, internal error", i), status: 500, problem: "internal", req: op}
		if i == 0 {
			c.before = renameMeterTables("", "_hidden")
		}
		if i == len(ops)-1 {
			c.after = renameMeterTables("_hidden", "")
		}
		cases = append(cases, c)
	}
	for i, op := range ops {
		c := apiCase{name: fmt.Sprintf("503 meter operation %d, database down", i), status: 503, problem: "service-unavailable", req: op, check: retryAfter}
		if i == 0 {
			c.before = func(t *testing.T, f *fixture) { f.proxy.SetDown(true) }
		}
		if i == len(ops)-1 {
			c.after = func(t *testing.T, f *fixture) { f.proxy.SetDown(false) }
		}
		cases = append(cases, c)
	}
	// Nothing of the failed operations was changed.
	cases = append(cases, apiCase{name: "200 list meters after the failures", status: 200, req: admin(http.MethodGet, "/v1/meters", ""),
		check: func(t *testing.T, f *fixture, r *result) {
			if got := meterKeys(t, r); len(got) != 5 || slices.Contains(got, "later") {
				t.Fatalf("meters %v", got)
			}
			if strings.Contains(string(r.body), apitest.AdminToken) {
				t.Fatal("the admin token is in the answer")
			}
		}})

	for _, c := range cases {
		if c.before != nil {
			c.before(t, f)
		}
		t.Run(c.name, func(t *testing.T) { f.run(t, c) })
		if c.after != nil {
			c.after(t, f)
		}
	}
	for path, item := range f.doc.Paths.Map() {
		for method, op := range item.Operations() {
			if !containsString(op.Tags, "meters") {
				continue
			}
			for status := range op.Responses.Map() {
				if !f.seen[op.OperationID][status] {
					t.Errorf("%s %s (%s): documented status %s was not exercised", method, path, op.OperationID, status)
				}
			}
		}
	}
}

func renameMeterTables(from, to string) func(t *testing.T, f *fixture) {
	return func(t *testing.T, f *fixture) {
		for _, name := range []string{"meters", "meter_catalog"} {
			if _, err := f.db.Exec(t.Context(), fmt.Sprintf(`ALTER TABLE %s%s RENAME TO %s%s`, name, from, name, to)); err != nil {
				t.Fatalf("rename %s%s: %v", name, from, err)
			}
		}
	}
}
