package api_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// litellmCall posts a LiteLLM delivery with bearer.
func litellmCall(bearer, body string) call {
	return call{method: http.MethodPost, path: "/v1/integrations/litellm", bearer: bearer, header: http.Header{}, body: body}
}

// litellmNow is the endTime of every payload: a call's payload is the
// same on every delivery.
var litellmNow = float64(time.Now().Add(-time.Minute).UnixMilli()) / 1e3

// litellmPayload is a StandardLoggingPayload as LiteLLM's callback sends
// it, with the fields overage reads and some it does not.
func litellmPayload(id, status string, prompt, completion int) string {
	now := litellmNow
	return fmt.Sprintf(`{"id":%q,"trace_id":"t-1","call_type":"acompletion","stream":false,"response_cost":0.0004,"status":%q,`+
		`"custom_llm_provider":"openai","total_tokens":%d,"prompt_tokens":%d,"completion_tokens":%d,"startTime":%.3f,"endTime":%.3f,`+
		`"completionStartTime":%.3f,"response_time":1.2,"model":"gpt-4o","model_id":"d7a1","model_group":"gpt-4o","api_base":"http://127.0.0.1:4000",`+
		`"metadata":{"user_api_key_user_id":"key-user","user_api_key_team_id":null},"cache_hit":null,"cache_key":null,"saved_cache_cost":0,`+
		`"request_tags":[],"end_user":"u_42","requester_ip_address":"127.0.0.1","messages":[],"response":{},"error_str":null,`+
		`"model_parameters":{},"hidden_params":{}}`, id, status, prompt+completion, prompt, completion, now-1.2, now, now-1)
}

// TestLiteLLMAPIConformsToOpenAPI exercises every documented status of
// POST /v1/integrations/litellm against the real server and validates each
// request and answer against api/openapi.yaml.
func TestLiteLLMAPIConformsToOpenAPI(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	alice := func(f *fixture) string { return f.alice.APIKey }
	delivery := "[" + litellmPayload("chatcmpl-ll-1", "success", 1200, 350) + "," + litellmPayload("chatcmpl-ll-2", "failure", 0, 0) + "]"
	var first []byte
	big := `[{"id":"big","status":"success","model":"m","prompt_tokens":1,"completion_tokens":1,"messages":"` + strings.Repeat("a", 32<<20) + `"}]`

	cases := []apiCase{
		{name: "202 the successful call recorded", status: 202,
			req: func(f *fixture) call { return litellmCall(alice(f), delivery) },
			check: func(t *testing.T, f *fixture, r *result) {
				m := r.json(t)
				evs, _ := m["events"].([]any)
				if m["created"] != 1.0 || len(evs) != 1 || evs[0].(map[string]any)["request_id"] != "chatcmpl-ll-1" {
					t.Fatalf("answer %s", r.body)
				}
				first = r.body
			}},
		{name: "202 redelivery replayed", status: 202, replayed: true,
			req:   func(f *fixture) call { return litellmCall(alice(f), delivery) },
			check: sameBodyAs(func(*fixture) []byte { return first })},
		{name: "202 the call redelivered alone is the same delivery", status: 202, replayed: true,
			req: func(f *fixture) call {
				return litellmCall(alice(f), litellmPayload("chatcmpl-ll-1", "success", 1200, 350))
			},
			check: sameBodyAs(func(*fixture) []byte { return first })},
		{name: "202 the call in another list, a duplicate", status: 202,
			req: func(f *fixture) call {
				return litellmCall(alice(f), "["+litellmPayload("chatcmpl-ll-7", "success", 5, 5)+","+litellmPayload("chatcmpl-ll-1", "success", 1200, 350)+"]")
			},
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); m["duplicates"] != 1.0 || m["created"] != 1.0 {
					t.Fatalf("answer %s", r.body)
				}
			}},
		{name: "200 failed calls only", status: 200,
			req: func(f *fixture) call {
				return litellmCall(alice(f), "["+litellmPayload("chatcmpl-ll-3", "failure", 0, 0)+"]")
			}},
		{name: "409 the same ids with other counts", status: 409, problem: "idempotency-key-reused",
			req: func(f *fixture) call {
				return litellmCall(alice(f), "["+litellmPayload("chatcmpl-ll-1", "success", 1, 350)+","+litellmPayload("chatcmpl-ll-2", "failure", 0, 0)+"]")
			}},
		{name: "400 not JSON", status: 400, problem: "malformed-request", field: "body", docRefuses: true,
			req: func(f *fixture) call { return litellmCall(alice(f), `[{"id":`) }},
		{name: "401 no API key", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return litellmCall("", delivery) }},
		{name: "403 a suspended tenant", status: 403, problem: "tenant-suspended",
			req: func(f *fixture) call { return litellmCall(f.suspended.APIKey, delivery) }},
		{name: "422 a successful call without model", status: 422, problem: "validation-failed", field: "[0].model",
			req: func(f *fixture) call {
				return litellmCall(alice(f), strings.Replace(litellmPayload("chatcmpl-ll-4", "success", 5, 5), `"model":"gpt-4o"`, `"model":""`, 1))
			}},
		{name: "413 over 32 MiB", status: 413, problem: "payload-too-large",
			req: func(f *fixture) call { return litellmCall(alice(f), big) }},
		{name: "500 internal error", status: 500, problem: "internal",
			before: renameTables("", "_hidden"),
			req: func(f *fixture) call {
				return litellmCall(alice(f), "["+litellmPayload("chatcmpl-ll-5", "success", 5, 5)+"]")
			},
			after: renameTables("_hidden", "")},
		{name: "503 database down", status: 503, problem: "service-unavailable",
			before: func(t *testing.T, f *fixture) { f.proxy.SetDown(true) },
			req: func(f *fixture) call {
				return litellmCall(alice(f), "["+litellmPayload("chatcmpl-ll-6", "success", 5, 5)+"]")
			},
			check: retryAfter,
			after: func(t *testing.T, f *fixture) { f.proxy.SetDown(false) }},
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
			if !slices.Contains(op.Tags, "integrations") {
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
