package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/overage-billing/overage/internal/testkit/apitest"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

// noRedirects sends requests as the cases write them and returns each
// answer as the server gave it, a redirect too.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// jsonCall is an admin request with a JSON body, whatever its method.
func jsonCall(method, path, body string) call {
	h := http.Header{}
	if body != "" {
		h.Set("Content-Type", "application/json")
	}
	return call{method: method, path: path, bearer: apitest.AdminToken, header: h, body: body}
}

// riverUICases are the browser sign-in of River UI, run among
// TestAPIConformsToOpenAPI's cases.
var riverUICases = func() []apiCase {
	var session string
	form := func(token string) func(f *fixture) call {
		return func(f *fixture) call {
			h := http.Header{}
			h.Set("Content-Type", "application/x-www-form-urlencoded")
			return call{method: http.MethodPost, path: "/riverui/login", header: h, body: url.Values{"token": {token}}.Encode()}
		}
	}
	return []apiCase{
		{name: "303 River UI, a browser not signed in", status: 303, docRefuses: true,
			req: func(f *fixture) call {
				h := http.Header{}
				h.Set("Accept", "text/html,application/xhtml+xml")
				return call{method: http.MethodGet, path: "/riverui/", header: h}
			}},
		{name: "200 River UI sign-in page", status: 200,
			req: func(f *fixture) call { return get("/riverui/login", "") },
			check: func(t *testing.T, f *fixture, r *result) {
				if !strings.Contains(string(r.body), `type="password"`) {
					t.Fatalf("no password field: %s", r.body)
				}
			}},
		{name: "401 River UI sign-in, wrong token", status: 401, req: form("not-the-token"),
			check: func(t *testing.T, f *fixture, r *result) {
				if r.header.Get("Set-Cookie") != "" {
					t.Fatal("a wrong token got a cookie")
				}
			}},
		{name: "303 River UI sign-in", status: 303, req: form(apitest.AdminToken),
			check: func(t *testing.T, f *fixture, r *result) {
				c, err := http.ParseSetCookie(r.header.Get("Set-Cookie"))
				if err != nil || strings.Contains(c.Value, apitest.AdminToken) {
					t.Fatalf("session cookie %q (%v)", r.header.Get("Set-Cookie"), err)
				}
				session = c.Name + "=" + c.Value
			}},
		{name: "200 River UI with the session cookie", status: 200,
			req: func(f *fixture) call {
				h := http.Header{}
				h.Set("Cookie", session)
				return call{method: http.MethodGet, path: "/riverui/", header: h}
			}},
	}
}()

// TestTenantAPIConformsToOpenAPI exercises every documented status of the
// /v1/tenants operations against the real server and validates each
// request and answer against api/openapi.yaml.
func TestTenantAPIConformsToOpenAPI(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	admin := func(method, path, body string) func(f *fixture) call {
		return func(f *fixture) call { return jsonCall(method, path, body) }
	}
	var id, keyID, newKey string
	tenant := func(suffix string) func(f *fixture) call {
		return func(f *fixture) call { return get("/v1/tenants/"+id+suffix, apitest.AdminToken) }
	}
	with := func(method string, path func() string, body string) func(f *fixture) call {
		return func(f *fixture) call { return jsonCall(method, path(), body) }
	}
	tenantPath := func(suffix string) func() string { return func() string { return "/v1/tenants/" + id + suffix } }
	keyPath := func() string { return "/v1/tenants/" + id + "/api-keys/" + keyID }
	const unknown = "0192f3a4-5b6c-7d8e-9f01-23456789abcd"
	noKeyIn := func(t *testing.T, f *fixture, r *result) {
		for _, k := range []string{f.alice.APIKey, newKey} {
			if k != "" && strings.Contains(string(r.body), k) {
				t.Fatalf("an API key is shown again: %s", r.body)
			}
		}
	}

	emu := emulator.New(emulator.Options{})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	emu.AddCustomer("cus_globex_2")
	withStripe := apitest.StartWith(t, f.srv.Pool, f.srv.DBURL, apitest.Options{StripeAPIBase: base})
	// Nothing listens on port 1 of loopback: the connection is refused.
	stripeDown := apitest.StartWith(t, f.srv.Pool, f.srv.DBURL, apitest.Options{StripeAPIBase: "http://127.0.0.1:1"})

	cases := []apiCase{
		{name: "201 create tenant", status: 201,
			req: admin(http.MethodPost, "/v1/tenants", `{"name":"Globex","stripe_customer_id":"cus_globex","included_input_tokens":100}`),
			check: func(t *testing.T, f *fixture, r *result) {
				m := r.json(t)
				id = m["id"].(string)
				if r.header.Get("Location") != "/v1/tenants/"+id || !strings.HasPrefix(m["api_key"].(string), "ovg_") {
					t.Fatalf("Location %q, body %s", r.header.Get("Location"), r.body)
				}
			}},
		{name: "400 create tenant, unknown field", status: 400, problem: "malformed-request", field: "body", docRefuses: true,
			req: admin(http.MethodPost, "/v1/tenants", `{"name":"x","stripe_customer_id":"cus_x","included_tokens":5}`)},
		{name: "401 create tenant without token", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return call{method: http.MethodPost, path: "/v1/tenants", body: `{}`} }},
		{name: "401 create tenant with a tenant key", status: 401, problem: "unauthorized",
			req: func(f *fixture) call {
				return call{method: http.MethodPost, path: "/v1/tenants", bearer: f.alice.APIKey, body: `{"name":"x","stripe_customer_id":"cus_x"}`}
			}},
		{name: "413 create tenant over 64 KiB", status: 413, problem: "payload-too-large",
			req: admin(http.MethodPost, "/v1/tenants", `{"name":"x","stripe_customer_id":"cus_x"`+strings.Repeat(" ", 65<<10)+`}`)},
		{name: "422 create tenant, bad customer", status: 422, problem: "validation-failed", field: "stripe_customer_id", docRefuses: true,
			req: admin(http.MethodPost, "/v1/tenants", `{"name":"x","stripe_customer_id":"acme"}`)},
		{name: "422 create tenant, blank name", status: 422, problem: "validation-failed", field: "name",
			req: admin(http.MethodPost, "/v1/tenants", `{"name":"  ","stripe_customer_id":"cus_x"}`)},
		{name: "201 create tenant with an allowance per meter", status: 201,
			req: admin(http.MethodPost, "/v1/tenants", `{"name":"Initech","stripe_customer_id":"cus_initech","included_output_tokens":3,"included":{"input":5}}`),
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); fmt.Sprint(m["included"]) != "map[input:5 output:3]" || m["included_input_tokens"] != 5.0 {
					t.Fatalf("created: %s", r.body)
				}
			}},
		{name: "422 create tenant, an allowance of no meter", status: 422, problem: "validation-failed", field: "included.nope",
			req: admin(http.MethodPost, "/v1/tenants", `{"name":"x","stripe_customer_id":"cus_x","included":{"nope":5}}`)},

		{name: "200 list tenants", status: 200, req: admin(http.MethodGet, "/v1/tenants", ""),
			check: func(t *testing.T, f *fixture, r *result) {
				noKeyIn(t, f, r)
				if !strings.Contains(string(r.body), id) || !strings.Contains(string(r.body), f.alice.ID.String()) {
					t.Fatalf("the list lacks a tenant: %s", r.body)
				}
			}},
		{name: "200 list tenants, a page at a time", status: 200, req: admin(http.MethodGet, "/v1/tenants?limit=2", ""),
			check: pagesAgree("/v1/tenants", adminBearer, "tenants", "id", 2)},
		{name: "400 list tenants, limit out of range", status: 400, problem: "malformed-request", field: "limit", docRefuses: true,
			req: admin(http.MethodGet, "/v1/tenants?limit=0", "")},
		{name: "400 list tenants, cursor of another list", status: 400, problem: "malformed-request", field: "cursor",
			req: admin(http.MethodGet, "/v1/tenants?cursor=eyJuIjo1fQ", "")},
		{name: "401 list tenants without token", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/tenants", "") }},

		{name: "201 another API key", status: 201, req: with(http.MethodPost, tenantPath("/api-keys"), ""),
			check: func(t *testing.T, f *fixture, r *result) {
				m := r.json(t)
				keyID, newKey = m["id"].(string), m["api_key"].(string)
				if m["tenant_id"] != id || !strings.HasPrefix(newKey, m["prefix"].(string)) {
					t.Fatalf("new key %s", r.body)
				}
			}},
		{name: "202 the new key records usage", status: 202,
			req: func(f *fixture) call { return post(newKey, "tenant-key-1", event(10, 1)) }},
		{name: "404 API key for an unknown tenant", status: 404, problem: "not-found",
			req: admin(http.MethodPost, "/v1/tenants/"+unknown+"/api-keys", "")},
		{name: "401 API key without token", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return call{method: http.MethodPost, path: "/v1/tenants/" + id + "/api-keys"} }},

		{name: "200 show tenant", status: 200, req: tenant(""),
			check: func(t *testing.T, f *fixture, r *result) {
				noKeyIn(t, f, r)
				var d struct {
					APIKeys []struct{ ID, Prefix string } `json:"api_keys"`
				}
				if err := json.Unmarshal(r.body, &d); err != nil || len(d.APIKeys) != 2 || d.APIKeys[1].ID != keyID {
					t.Fatalf("api_keys of %s (%v)", r.body, err)
				}
			}},
		{name: "404 show unknown tenant", status: 404, problem: "not-found", req: admin(http.MethodGet, "/v1/tenants/"+unknown, "")},
		{name: "404 show tenant, id not a UUID", status: 404, problem: "not-found", docRefuses: true, req: admin(http.MethodGet, "/v1/tenants/globex", "")},
		{name: "401 show tenant with a wrong token", status: 401, problem: "unauthorized",
			req: func(f *fixture) call { return get("/v1/tenants/"+id, "not-the-admin-token") }},

		{name: "200 update tenant's allowance", status: 200, req: with(http.MethodPatch, tenantPath(""), `{"included_input_tokens":5000}`),
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); m["included_input_tokens"] != 5000.0 || m["name"] != "Globex" {
					t.Fatalf("updated: %s", r.body)
				}
			}},
		{name: "200 set the alert endpoint: the secret once", status: 200,
			req: with(http.MethodPatch, tenantPath(""), `{"alert_url":"https://example.com/hooks/overage","alert_at":[100,80]}`),
			check: func(t *testing.T, f *fixture, r *result) {
				m := r.json(t)
				sec, _ := m["alert_secret"].(string)
				if m["alert_url"] != "https://example.com/hooks/overage" || fmt.Sprint(m["alert_at"]) != "[80 100]" || !strings.HasPrefix(sec, "whsec_") {
					t.Fatalf("updated: %s", r.body)
				}
			}},
		{name: "200 the secret is not shown again", status: 200, req: with(http.MethodGet, tenantPath(""), ""),
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); m["alert_secret"] != nil || m["alert_url"] != "https://example.com/hooks/overage" {
					t.Fatalf("shown: %s", r.body)
				}
			}},
		{name: "200 clear the alert endpoint and thresholds", status: 200,
			req: with(http.MethodPatch, tenantPath(""), `{"alert_url":"","alert_at":[]}`),
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); m["alert_url"] != nil || fmt.Sprint(m["alert_at"]) != "[]" || m["alert_secret"] != nil {
					t.Fatalf("cleared: %s", r.body)
				}
			}},
		{name: "422 update, threshold out of range", status: 422, problem: "validation-failed", field: "alert_at", docRefuses: true,
			req: with(http.MethodPatch, tenantPath(""), `{"alert_at":[0,101]}`)},
		{name: "422 update, alert URL not http", status: 422, problem: "validation-failed", field: "alert_url",
			req: with(http.MethodPatch, tenantPath(""), `{"alert_url":"ftp://example.com"}`)},
		{name: "200 update an allowance per meter", status: 200, req: with(http.MethodPatch, tenantPath(""), `{"included":{"output":7}}`),
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); fmt.Sprint(m["included"]) != "map[input:5000 output:7]" || m["included_output_tokens"] != 7.0 {
					t.Fatalf("updated: %s", r.body)
				}
			}},
		{name: "422 update, a negative allowance", status: 422, problem: "validation-failed", field: "included.input", docRefuses: true,
			req: with(http.MethodPatch, tenantPath(""), `{"included":{"input":-1}}`)},
		// A suspended tenant is lifted by a customer Stripe knows, asked
		// with GET /v1/customers/{id} on the servers that have Stripe.
		{name: "422 lift with a customer Stripe does not know", status: 422, problem: "validation-failed", field: "stripe_customer_id",
			before: func(t *testing.T, f *fixture) {
				if _, err := f.db.Exec(t.Context(), `UPDATE tenants SET suspended_at = now(), suspended_reason = 'Stripe customer deleted; tenant suspended' WHERE id = $1`, id); err != nil {
					t.Fatal(err)
				}
			},
			req: func(f *fixture) call {
				c := jsonCall(http.MethodPatch, "/v1/tenants/"+id, `{"stripe_customer_id":"cus_nobody"}`)
				c.base = withStripe.URL
				return c
			}},
		{name: "503 lift while Stripe does not answer", status: 503, problem: "stripe-unavailable", check: retryAfter,
			req: func(f *fixture) call {
				c := jsonCall(http.MethodPatch, "/v1/tenants/"+id, `{"stripe_customer_id":"cus_globex_2"}`)
				c.base = stripeDown.URL
				return c
			}},
		{name: "200 lift with a customer Stripe knows", status: 200,
			req: func(f *fixture) call {
				c := jsonCall(http.MethodPatch, "/v1/tenants/"+id, `{"stripe_customer_id":"cus_globex_2"}`)
				c.base = withStripe.URL
				return c
			},
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); m["suspended_at"] != nil || m["suspended_reason"] != nil || m["stripe_customer_id"] != "cus_globex_2" {
					t.Fatalf("after the lift: %s", r.body)
				}
			}},
		{name: "400 update, unknown field", status: 400, problem: "malformed-request", field: "body", docRefuses: true,
			req: with(http.MethodPatch, tenantPath(""), `{"included_input_token":5}`)},
		{name: "422 update, nothing to change", status: 422, problem: "validation-failed", field: "body", docRefuses: true,
			req: with(http.MethodPatch, tenantPath(""), `{}`)},
		{name: "404 update unknown tenant", status: 404, problem: "not-found", req: admin(http.MethodPatch, "/v1/tenants/"+unknown, `{"name":"x"}`)},
		{name: "401 update without token", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call {
				c := jsonCall(http.MethodPatch, "/v1/tenants/"+id, `{"name":"x"}`)
				c.bearer = ""
				return c
			}},

		{name: "200 revoke API key", status: 200, req: with(http.MethodDelete, keyPath, ""),
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); m["revoked_at"] == nil || m["id"] != keyID {
					t.Fatalf("revoked: %s", r.body)
				}
			}},
		{name: "401 the revoked key, at once", status: 401, problem: "unauthorized",
			req: func(f *fixture) call { return post(newKey, "tenant-key-2", event(10, 1)) }},
		{name: "200 revoke it again", status: 200, req: with(http.MethodDelete, keyPath, "")},
		{name: "404 revoke an unknown key", status: 404, problem: "not-found",
			req: with(http.MethodDelete, func() string { return "/v1/tenants/" + id + "/api-keys/" + unknown }, "")},
		{name: "404 revoke another tenant's key", status: 404, problem: "not-found",
			req: with(http.MethodDelete, func() string { return "/v1/tenants/" + f.alice.ID.String() + "/api-keys/" + keyID }, "")},
		{name: "405 PUT /v1/tenants carries Allow", status: 405, problem: "method-not-allowed", undocumented: "MethodNotAllowed",
			req: admin(http.MethodPut, "/v1/tenants", ""),
			check: func(t *testing.T, f *fixture, r *result) {
				if got := strings.Join(r.header.Values("Allow"), ", "); got != "GET, POST" {
					t.Fatalf("Allow = %q, want GET, POST", got)
				}
			}},
		{name: "401 revoke without token", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return call{method: http.MethodDelete, path: keyPath()} }},
	}
	// Every operation, with the tables renamed away (500) and with the
	// database down (503).
	ops := []func(f *fixture) call{
		admin(http.MethodPost, "/v1/tenants", `{"name":"x","stripe_customer_id":"cus_x"}`),
		admin(http.MethodGet, "/v1/tenants", ""),
		tenant(""),
		with(http.MethodPatch, tenantPath(""), `{"name":"x"}`),
		with(http.MethodPost, tenantPath("/api-keys"), ""),
		with(http.MethodDelete, keyPath, ""),
	}
	for i, op := range ops {
		c := apiCase{name: fmt.Sprintf("500 tenant operation %d, internal error", i), status: 500, problem: "internal", req: op}
		if i == 0 {
			c.before = renameTenantTables("", "_hidden")
		}
		if i == len(ops)-1 {
			c.after = renameTenantTables("_hidden", "")
		}
		cases = append(cases, c)
	}
	for i, op := range ops {
		c := apiCase{name: fmt.Sprintf("503 tenant operation %d, database down", i), status: 503, problem: "service-unavailable", req: op, check: retryAfter}
		if i == 0 {
			c.before = func(t *testing.T, f *fixture) { f.proxy.SetDown(true) }
		}
		if i == len(ops)-1 {
			c.after = func(t *testing.T, f *fixture) { f.proxy.SetDown(false) }
		}
		cases = append(cases, c)
	}

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
			if !containsString(op.Tags, "tenants") {
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

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func renameTenantTables(from, to string) func(t *testing.T, f *fixture) {
	return func(t *testing.T, f *fixture) {
		for _, name := range []string{"tenants", "api_keys"} {
			if _, err := f.db.Exec(t.Context(), fmt.Sprintf(`ALTER TABLE %s%s RENAME TO %s%s`, name, from, name, to)); err != nil {
				t.Fatalf("rename %s%s: %v", name, from, err)
			}
		}
	}
}
