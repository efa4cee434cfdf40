package api_test

import (
	"context"
	"slices"
	"testing"

	"github.com/overage-billing/overage/internal/testkit/apitest"
	"github.com/overage-billing/overage/tenants"
)

// TestAlertsAPIConformsToOpenAPI exercises every documented status of
// GET /v1/usage and GET /v1/events against the real server and validates
// each request and answer against api/openapi.yaml.
func TestAlertsAPIConformsToOpenAPI(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	// Whatever alice used before, one event of 3U+300 tokens takes her
	// input meter across 50% and 100% of an allowance of 2U+200.
	var used int64
	if err := f.db.QueryRow(ctx, `SELECT coalesce(sum(input_tokens), 0)::bigint FROM allowance_usage WHERE tenant_id = $1`, f.alice.ID).Scan(&used); err != nil {
		t.Fatal(err)
	}
	at := []int{50, 100}
	url := "http://127.0.0.1:1/hook"
	allowance := 2*used + 200
	d, err := tenants.NewStore(f.db).Update(ctx, f.alice.ID, tenants.UpdateParams{AlertAt: &at, AlertURL: &url, IncludedInputTokens: &allowance})
	if err != nil || d.AlertSecret == "" {
		t.Fatalf("set alerts: %v %+v", err, d)
	}
	alice := func(f *fixture) string { return f.alice.APIKey }
	var next string
	cases := []apiCase{
		{name: "202 usage that crosses two thresholds", status: 202,
			req: func(f *fixture) call { return post(alice(f), "k-alerts-1", event(int(3*used+300), 5)) }},
		{name: "200 usage", status: 200,
			req: func(f *fixture) call { return get("/v1/usage", alice(f)) },
			check: func(t *testing.T, f *fixture, r *result) {
				m := r.json(t)
				if ms, _ := m["meters"].([]any); len(ms) != 2 || ms[0].(map[string]any)["used"] == 0.0 {
					t.Fatalf("usage %s", r.body)
				}
			}},
		{name: "200 usage of an earlier period, admin", status: 200,
			req: func(f *fixture) call {
				return get("/v1/usage?tenant_id="+f.alice.ID.String()+"&period_start=2026-01-01T00:00:00Z", apitest.AdminToken)
			}},
		{name: "400 period_start malformed", status: 400, problem: "malformed-request", field: "period_start", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/usage?period_start=yesterday", alice(f)) }},
		{name: "400 admin without tenant_id", status: 400, problem: "malformed-request", field: "tenant_id",
			req: func(f *fixture) call { return get("/v1/usage", apitest.AdminToken) }},
		{name: "401 usage without a key", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/usage", "") }},
		{name: "403 another tenant's id", status: 403, problem: "tenant-mismatch",
			req: func(f *fixture) call { return get("/v1/usage?tenant_id="+f.bob.ID.String(), alice(f)) }},
		{name: "404 unknown tenant, admin", status: 404, problem: "not-found",
			req: func(f *fixture) call {
				return get("/v1/usage?tenant_id=00000000-0000-7000-8000-000000000000", apitest.AdminToken)
			}},

		{name: "200 events, first page", status: 200,
			req: func(f *fixture) call { return get("/v1/events?limit=1", alice(f)) },
			check: func(t *testing.T, f *fixture, r *result) {
				m := r.json(t)
				data, _ := m["data"].([]any)
				if len(data) != 1 || m["has_more"] != true {
					t.Fatalf("events %s", r.body)
				}
				next, _ = m["next_starting_after"].(string)
			}},
		{name: "200 events, next page", status: 200,
			req: func(f *fixture) call { return get("/v1/events?limit=1&starting_after="+next, alice(f)) },
			check: func(t *testing.T, f *fixture, r *result) {
				m := r.json(t)
				data, _ := m["data"].([]any)
				if len(data) != 1 || m["has_more"] != false {
					t.Fatalf("events %s", r.body)
				}
			}},
		{name: "400 events, starting_after malformed", status: 400, problem: "malformed-request", field: "starting_after", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/events?starting_after=evt_x", alice(f)) }},
		{name: "401 events without a key", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/events", "") }},
		// Last: connections cut by the proxy may still fail a request or
		// two once it is back.
		{name: "503 usage, database down", status: 503, problem: "service-unavailable",
			before: func(t *testing.T, f *fixture) { f.proxy.SetDown(true) },
			req:    func(f *fixture) call { return get("/v1/usage", alice(f)) },
			after:  func(t *testing.T, f *fixture) { f.proxy.SetDown(false) }},
		{name: "503 events, database down", status: 503, problem: "service-unavailable",
			before: func(t *testing.T, f *fixture) { f.proxy.SetDown(true) },
			req:    func(f *fixture) call { return get("/v1/events", alice(f)) },
			after:  func(t *testing.T, f *fixture) { f.proxy.SetDown(false) }},
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
			if !slices.Contains(op.Tags, "alerts") {
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
