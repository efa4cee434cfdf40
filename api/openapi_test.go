package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v79/webhook"

	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/apitest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/tenants"
)

// problemBase prefixes every problem type URI.
const problemBase = "https://overage.dev/problems/"

// contract is api/openapi.yaml, loaded, validated and routable.
type contract struct {
	doc    *openapi3.T
	router routers.Router
	// problemStatus is the x-status of each problem slug the document lists.
	problemStatus map[string]int
}

// loadContract loads and validates the document. Each test loads its own
// copy: kin-openapi caches compiled schemas inside the document.
func loadContract(t *testing.T) *contract {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("openapi.yaml")
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() || doc.OpenAPIMajorMinor() != "3.1" {
		t.Fatalf("openapi.yaml is OpenAPI %q, want 3.1.x", doc.OpenAPI)
	}
	// Validate turns on JSON Schema 2020-12 for a 3.1 document, and checks
	// every example against its schema.
	if err := doc.Validate(loader.Context, openapi3.EnableMultiError()); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI 3.1 document: %v", err)
	}
	// Route by path alone: the test server listens on a random loopback
	// port, not on the documented server URL.
	doc.Servers = nil
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatalf("route openapi.yaml: %v", err)
	}
	c := &contract{doc: doc, router: router, problemStatus: map[string]int{}}
	pt := doc.Components.Schemas["ProblemType"]
	if pt == nil || pt.Value == nil || len(pt.Value.OneOf) == 0 {
		t.Fatal("openapi.yaml has no components.schemas.ProblemType listing the problem types")
	}
	for _, s := range pt.Value.OneOf {
		uri, _ := s.Value.Const.(string)
		slug, ok := strings.CutPrefix(uri, problemBase)
		if !ok || slug == "" {
			t.Fatalf("ProblemType lists %v, want %s<slug>", s.Value.Const, problemBase)
		}
		if s.Value.Title != slug {
			t.Errorf("ProblemType %s has title %q, want the slug", uri, s.Value.Title)
		}
		status, err := strconv.Atoi(fmt.Sprint(s.Value.Extensions["x-status"]))
		if err != nil || http.StatusText(status) == "" {
			t.Fatalf("ProblemType %s: x-status %v is not an HTTP status", uri, s.Value.Extensions["x-status"])
		}
		if _, dup := c.problemStatus[slug]; dup {
			t.Fatalf("ProblemType lists %s twice", slug)
		}
		c.problemStatus[slug] = status
	}
	return c
}

// TestOpenAPIDocument checks the document on its own: valid OpenAPI 3.1,
// the advertised key lifetime equal to the server's, and problem types
// that agree between the list and each response.
func TestOpenAPIDocument(t *testing.T) {
	t.Parallel()
	c := loadContract(t)

	key := c.doc.Components.Parameters["IdempotencyKey"]
	if key == nil || key.Value == nil || key.Value.In != "header" || key.Value.Name != "Idempotency-Key" || !key.Value.Required {
		t.Fatal("components.parameters.IdempotencyKey must be the required Idempotency-Key header")
	}
	secs, err := strconv.ParseFloat(fmt.Sprint(key.Value.Extensions["x-key-lifetime-seconds"]), 64)
	if err != nil || secs != ingest.KeyTTL.Seconds() {
		t.Errorf("Idempotency-Key x-key-lifetime-seconds = %v, want ingest.KeyTTL = %v s", key.Value.Extensions["x-key-lifetime-seconds"], ingest.KeyTTL.Seconds())
	}
	lifetime := fmt.Sprintf("%d hours", int(ingest.KeyTTL.Hours()))
	for where, text := range map[string]string{"info.description": c.doc.Info.Description, "the Idempotency-Key parameter": key.Value.Description} {
		if !strings.Contains(text, lifetime) {
			t.Errorf("%s does not state the key lifetime %q", where, lifetime)
		}
	}
	for _, phrase := range []string{"RFC 8785", "SHA-256", "per tenant", "422", "Idempotent-Replayed"} {
		if !strings.Contains(c.doc.Info.Description, phrase) {
			t.Errorf("info.description does not mention %q", phrase)
		}
	}

	// Every problem response narrows Problem to types whose x-status is the
	// status it states.
	for name, ref := range c.doc.Components.Responses {
		if len(ref.Value.Content) != 1 {
			t.Errorf("components.responses.%s has %d media types, want one problem", name, len(ref.Value.Content))
			continue
		}
		var s *openapi3.Schema
		for _, mt := range ref.Value.Content {
			s = mt.Schema.Value
		}
		status, _ := s.Properties["status"].Value.Const.(float64)
		typ := s.Properties["type"].Value
		uris := typ.Enum
		if typ.Const != nil {
			uris = append(uris, typ.Const)
		}
		if status == 0 || len(uris) == 0 {
			t.Errorf("components.responses.%s does not fix the problem status and type", name)
		}
		for _, u := range uris {
			slug := strings.TrimPrefix(fmt.Sprint(u), problemBase)
			if got, ok := c.problemStatus[slug]; !ok || got != int(status) {
				t.Errorf("components.responses.%s: problem type %v has x-status %d in ProblemType, want %v", name, u, got, status)
			}
		}
	}
}

// call is one HTTP request of a case.
type call struct {
	method, path string
	bearer       string // the Authorization: Bearer credential, "" for none
	header       http.Header
	body         string
	// base is the server to send to, "" for the fixture's.
	base string
}

func post(bearer, key, body string) call {
	h := http.Header{}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return call{method: http.MethodPost, path: "/v1/usage-events", bearer: bearer, header: h, body: body}
}

func postBatch(bearer, key, body string) call {
	c := post(bearer, key, body)
	c.path = "/v1/usage-events/batch"
	return c
}

// batchOf is a batch body of the given events.
func batchOf(events ...string) string { return `{"events":[` + strings.Join(events, ",") + `]}` }

// withRID is a batch event with request_id rid.
func withRID(rid string, in, out int) string {
	return fmt.Sprintf(`{"request_id":%q,"user_id":"u_42","model_id":"gpt-4o","input_tokens":%d,"output_tokens":%d}`, rid, in, out)
}

func streamCheckpoint(rid string, seq int, final bool, in, out int) string {
	return fmt.Sprintf(`{"request_id":%q,"user_id":"u_42","model_id":"gpt-4o","input_tokens":%d,"output_tokens":%d,"stream":{"sequence":%d,"final":%t}}`,
		rid, in, out, seq, final)
}

func correct(bearer, key, id string, in, out int) call {
	c := post(bearer, key, fmt.Sprintf(`{"input_tokens":%d,"output_tokens":%d,"reason":"recount"}`, in, out))
	c.path = "/v1/usage-events/" + id + "/corrections"
	return c
}

func get(path, bearer string) call {
	return call{method: http.MethodGet, path: path, bearer: bearer}
}

// stripeEvent is a Stripe event of the platform account, as Stripe sends it.
func stripeEvent(id string) string {
	return fmt.Sprintf(`{"id":%q,"object":"event","type":"customer.updated","api_version":"2024-06-20","created":%d,"livemode":false,`+
		`"pending_webhooks":1,"data":{"object":{"id":"cus_alice","object":"customer"}}}`, id, time.Now().Unix())
}

// stripeSign returns the Stripe-Signature of body with secret at ts.
func stripeSign(body, secret string, ts time.Time) string {
	return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: []byte(body), Secret: secret, Timestamp: ts}).Header
}

// stripeWebhook is a delivery of body with the Stripe-Signature sig ("" for none).
func stripeWebhook(body, sig string) call {
	h := http.Header{}
	if sig != "" {
		h.Set("Stripe-Signature", sig)
	}
	return call{method: http.MethodPost, path: "/v1/webhooks/stripe", header: h, body: body}
}

// signedWebhook is a delivery of body signed now with apitest.WebhookSecret.
func signedWebhook(body string) call {
	return stripeWebhook(body, stripeSign(body, apitest.WebhookSecret, time.Now()))
}

// request builds the HTTP request of c against baseURL. A POST carries
// Content-Type: application/json unless the case sets another.
func (c call) request(ctx context.Context, baseURL string) (*http.Request, error) {
	if c.base != "" {
		baseURL = c.base
	}
	var body io.Reader = http.NoBody
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req, err := http.NewRequestWithContext(ctx, c.method, baseURL+c.path, body)
	if err != nil {
		return nil, err
	}
	for k, vs := range c.header {
		req.Header[k] = slices.Clone(vs)
	}
	if c.method == http.MethodPost && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+c.bearer)
	}
	return req, nil
}

type result struct {
	status int
	header http.Header
	body   []byte
}

func (r *result) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response is not a JSON object: %v: %s", err, r.body)
	}
	return m
}

// apiCase is one exchange with the real server, validated against the
// document. Cases run in order; later ones may use what earlier ones
// stored in the fixture.
type apiCase struct {
	name string
	// before and after run around the case outside its subtest, so they
	// run even when the case is skipped or fails.
	before, after func(t *testing.T, f *fixture)
	req           func(f *fixture) call
	// awaitInflight: send nothing; the answer is the one of the request
	// started by an earlier case's before (f.inflight).
	awaitInflight bool

	status   int
	problem  string // problem slug; "" when the answer is not a problem
	field    string // a field the problem's errors must name
	replayed bool   // Idempotent-Replayed: true expected
	// docRefuses: the document itself refuses the request (it breaks a
	// schema, a format, a required header or the security requirement), so
	// openapi3filter.ValidateRequest must fail. Otherwise it must pass.
	docRefuses bool
	// undocumented names the components.responses entry that describes the
	// answer to a path or method the document does not list.
	undocumented string
	check        func(t *testing.T, f *fixture, r *result)
}

type inflight struct {
	res *result
	err error
}

// fixture is a real server on a fresh database, reached by its pool
// through a proxy the test can cut, plus what the cases share.
type fixture struct {
	*contract
	srv *apitest.Server
	// noSecret is the same API without STRIPE_WEBHOOK_SECRET.
	noSecret *apitest.Server
	// busy is the same API with TENANT_MAX_INFLIGHT=1.
	busy  *apitest.Server
	db    *pgxpool.Pool // direct, not through the proxy
	proxy *pgtest.Proxy

	alice, bob, capped *tenants.Created
	// suspended is a tenant whose Stripe customer was deleted; suspendedID
	// is a log it recorded before.
	suspended   *tenants.Created
	suspendedID string
	revokedKey  string

	body1, body1Reordered string
	logID                 string
	firstBody, dupBody    []byte
	batchBody             []byte
	billedID, failedID    string
	reviewID, freeID      string
	closedID              string

	lockTx       pgx.Tx
	inflightCall call
	inflight     chan inflight

	// seen records each documented operation and status exercised;
	// emitted, each problem slug answered.
	seen    map[string]map[string]bool
	emitted map[string]bool
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	proxy, viaProxy := pgtest.NewProxy(t, dbURL)
	pc, err := pgxpool.ParseConfig(viaProxy)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	direct, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	srv := apitest.StartOn(t, pool, dbURL)

	f := &fixture{
		contract: loadContract(t), srv: srv, db: direct, proxy: proxy,
		noSecret: apitest.StartWith(t, pool, dbURL, apitest.Options{}),
		busy:     apitest.StartWith(t, pool, dbURL, apitest.Options{WebhookSecret: apitest.WebhookSecret, TenantMaxInflight: 1}),
		alice:    srv.Tenant(t, "alice", 0, 0), bob: srv.Tenant(t, "bob", 0, 0), capped: srv.Tenant(t, "capped", 1000, 500),
		inflight: make(chan inflight, 1),
		seen:     map[string]map[string]bool{}, emitted: map[string]bool{},
	}
	store := tenants.NewStore(direct)
	if f.revokedKey, err = store.CreateKey(ctx, f.alice.ID); err != nil {
		t.Fatal(err)
	}
	if err := store.RevokeKey(ctx, f.revokedKey); err != nil {
		t.Fatal(err)
	}

	ts := time.Now().UTC().Add(-time.Hour).Truncate(time.Second).Format(time.RFC3339)
	f.body1 = fmt.Sprintf(`{"request_id":"chatcmpl-1","timestamp":"%s","user_id":"u_42","model_id":"gpt-4o","input_tokens":1200,"output_tokens":350,"tenant_id":"%s"}`, ts, f.alice.ID)
	f.body1Reordered = fmt.Sprintf("{\n  \"tenant_id\": \"%s\",\n  \"output_tokens\": 350, \"input_tokens\" : 1200,\n\t\"model_id\":\"gpt-4o\", \"user_id\":\"u_42\",\"timestamp\":\"%s\", \"request_id\":\"chatcmpl-1\"\n}", f.alice.ID, ts)

	// Usage logs in every billing status, as the report worker and the
	// sweep leave them, for GET /v1/usage-events/{id}.
	f.billedID = f.seed(t, "seed-billed", event(40, 4), `UPDATE usage_logs SET billing_status = 'billed',
		first_attempt_at = now() - interval '2 seconds', input_accepted_at = now() - interval '1 second',
		output_accepted_at = now(), billed_at = now(), input_report_lead = id, output_report_lead = id WHERE id = $1`)
	f.failedID = f.seed(t, "seed-failed", event(30, 0), `UPDATE usage_logs SET billing_status = 'failed',
		first_attempt_at = now(), billing_message = 'No such customer: ''cus_alice''' WHERE id = $1`)
	f.reviewID = f.seed(t, "seed-review", event(20, 2), `UPDATE usage_logs SET billing_status = 'needs_review',
		first_attempt_at = now() - interval '25 hours', input_accepted_at = now() - interval '25 hours' WHERE id = $1`)
	// A log of a billing period that closed weeks ago, its tokens in that
	// period's total.
	f.closedID = f.seed(t, "seed-closed", event(25, 5), `WITH u AS (
			UPDATE usage_logs SET period_start = date_trunc('month', now() - interval '40 days', 'UTC') WHERE id = $1
			RETURNING tenant_id, period_start, input_tokens, output_tokens)
		INSERT INTO allowance_usage (tenant_id, period_start, slot, input_tokens, output_tokens)
		SELECT tenant_id, period_start, 0, input_tokens, output_tokens FROM u`)

	f.suspended = srv.Tenant(t, "suspended", 0, 0)
	r, err := f.send(ctx, post(f.suspended.APIKey, "before-suspension", event(10, 5)))
	if err != nil || r.status != http.StatusAccepted {
		t.Fatalf("seed the suspended tenant's log: %v %+v", err, r)
	}
	f.suspendedID = r.json(t)["id"].(string)
	if _, err := direct.Exec(ctx, `UPDATE tenants SET suspended_at = now(), suspended_reason = 'Stripe customer deleted; tenant suspended' WHERE id = $1`, f.suspended.ID); err != nil {
		t.Fatal(err)
	}
	return f
}

// seed records an event for alice outside the validated cases and moves
// its log with sql (given the log id as $1).
func (f *fixture) seed(t *testing.T, key, body, sql string) string {
	t.Helper()
	r, err := f.send(context.Background(), post(f.alice.APIKey, key, body))
	if err != nil {
		t.Fatalf("seed %s: %v", key, err)
	}
	if r.status != http.StatusAccepted {
		t.Fatalf("seed %s: status %d: %s", key, r.status, r.body)
	}
	id := r.json(t)["id"].(string)
	if _, err := f.db.Exec(context.Background(), sql, id); err != nil {
		t.Fatalf("seed %s: %v", key, err)
	}
	return id
}

func (f *fixture) send(ctx context.Context, c call) (*result, error) {
	req, err := c.request(ctx, f.srv.URL)
	if err != nil {
		return nil, err
	}
	res, err := noRedirects.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	return &result{status: res.StatusCode, header: res.Header, body: b}, nil
}

func event(in, out int) string {
	return fmt.Sprintf(`{"user_id":"u_42","model_id":"gpt-4o","input_tokens":%d,"output_tokens":%d}`, in, out)
}

// bearerPresent is the AuthenticationFunc of the validation: the document
// can say a bearer credential is required, not which one is valid.
func bearerPresent(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	if s := in.SecurityScheme; s.Type == "apiKey" && s.In == "cookie" {
		if _, err := in.RequestValidationInput.Request.Cookie(s.Name); err != nil {
			return in.NewError(fmt.Errorf("no %s cookie", s.Name))
		}
		return nil
	}
	if s := in.SecurityScheme; s.Type != "http" || !strings.EqualFold(s.Scheme, "bearer") {
		return in.NewError(fmt.Errorf("security scheme %q is not http bearer", in.SecuritySchemeName))
	}
	scheme, tok, ok := strings.Cut(in.RequestValidationInput.Request.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return in.NewError(errors.New("no bearer credential"))
	}
	return nil
}

// formats makes kin-openapi assert format: uuid, which it leaves
// unchecked by default.
var formats = []openapi3.SchemaValidationOption{
	openapi3.WithStringFormatValidator("uuid", openapi3.NewRegexpFormatValidator(openapi3.FormatOfStringForUUIDOfRFC9562)),
}

// conform validates the request and response of a case against the
// document.
func (f *fixture) conform(t *testing.T, c apiCase, cl call, r *result) {
	t.Helper()
	ctx := context.Background()
	req, err := cl.request(ctx, f.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	route, params, routeErr := f.router.FindRoute(req)
	// The legacy router lets a template variable match an empty segment
	// (GET /v1/usage-events finds /v1/usage-events/{id} with id ""): that
	// is no operation the document lists.
	for name, v := range params {
		if v == "" && routeErr == nil {
			routeErr = fmt.Errorf("path parameter %s is empty", name)
		}
	}
	reqOpts := &openapi3filter.Options{AuthenticationFunc: bearerPresent, SchemaValidationOptions: formats}
	resOpts := &openapi3filter.Options{IncludeResponseStatus: true, SchemaValidationOptions: formats}

	if c.undocumented != "" {
		if routeErr == nil {
			t.Fatalf("the document lists %s %s, but the case says it does not", cl.method, cl.path)
		}
		ref := f.doc.Components.Responses[c.undocumented]
		if ref == nil {
			t.Fatalf("the document has no components.responses.%s", c.undocumented)
		}
		route = &routers.Route{Spec: f.doc, Method: cl.method, Path: cl.path, PathItem: &openapi3.PathItem{},
			Operation: &openapi3.Operation{Responses: openapi3.NewResponses(openapi3.WithStatus(r.status, ref))}}
		in := &openapi3filter.ResponseValidationInput{
			RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, Route: route, Options: reqOpts},
			Status:                 r.status, Header: r.header, Options: resOpts,
		}
		if err := openapi3filter.ValidateResponse(ctx, in.SetBodyBytes(r.body)); err != nil {
			t.Errorf("the %d answer does not match components.responses.%s: %v", r.status, c.undocumented, err)
		}
		f.mark("components.responses."+c.undocumented, r.status)
		return
	}
	if routeErr != nil {
		t.Fatalf("the document has no operation for %s %s: %v", cl.method, cl.path, routeErr)
	}

	reqIn := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: reqOpts}
	err = openapi3filter.ValidateRequest(ctx, reqIn)
	switch {
	case c.docRefuses && err == nil:
		t.Errorf("the document accepts this request; the case says it breaks the document")
	case !c.docRefuses && err != nil:
		t.Errorf("the document refuses this request: %v", err)
	}

	resIn := &openapi3filter.ResponseValidationInput{RequestValidationInput: reqIn, Status: r.status, Header: r.header, Options: resOpts}
	if err := openapi3filter.ValidateResponse(ctx, resIn.SetBodyBytes(r.body)); err != nil {
		t.Errorf("the %d answer to %s %s does not match the document: %v\nbody: %s", r.status, cl.method, cl.path, err, r.body)
	}
	f.mark(route.Operation.OperationID, r.status)
}

func (f *fixture) mark(what string, status int) {
	if f.seen[what] == nil {
		f.seen[what] = map[string]bool{}
	}
	f.seen[what][strconv.Itoa(status)] = true
}

// problem checks the problem details of an answer, and that its type is
// one the document lists with this status.
func (f *fixture) problem(t *testing.T, c apiCase, r *result) {
	t.Helper()
	// The media type of each problem is the document's to say; conform
	// checks it.
	if r.header.Get("Content-Type") != "application/problem+json" && c.problem == "" {
		return
	}
	var p struct {
		Type, Title string
		Status      int
		Errors      []struct{ Field, Detail string }
	}
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem is not JSON: %v: %s", err, r.body)
	}
	slug, ok := strings.CutPrefix(p.Type, problemBase)
	if !ok {
		t.Fatalf("problem type %q does not start with %s", p.Type, problemBase)
	}
	f.emitted[slug] = true
	if slug != c.problem {
		t.Errorf("problem type %s, want %q; body: %s", slug, c.problem, r.body)
	}
	if want, listed := f.problemStatus[slug]; !listed {
		t.Errorf("problem type %s is not listed in openapi.yaml (components.schemas.ProblemType)", slug)
	} else if want != r.status {
		t.Errorf("problem type %s came with status %d; openapi.yaml lists it with %d", slug, r.status, want)
	}
	if p.Status != r.status || p.Title != http.StatusText(r.status) {
		t.Errorf("problem status/title = %d/%q, want %d/%q", p.Status, p.Title, r.status, http.StatusText(r.status))
	}
	if c.field != "" && !slices.ContainsFunc(p.Errors, func(e struct{ Field, Detail string }) bool { return e.Field == c.field }) {
		t.Errorf("problem errors %v do not name %s", p.Errors, c.field)
	}
}

func (f *fixture) run(t *testing.T, c apiCase) {
	t.Helper()
	var cl call
	var r *result
	if c.awaitInflight {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		select {
		case in := <-f.inflight:
			if in.err != nil {
				t.Fatalf("the in-flight request failed: %v", in.err)
			}
			cl, r = f.inflightCall, in.res
		case <-ctx.Done():
			t.Fatal("the in-flight request did not finish after its lock was released")
		}
	} else {
		cl = c.req(f)
		var err error
		if r, err = f.send(context.Background(), cl); err != nil {
			t.Fatal(err)
		}
	}
	if r.status != c.status {
		t.Fatalf("%s %s: status %d, want %d; body: %s", cl.method, cl.path, r.status, c.status, r.body)
	}
	f.problem(t, c, r)
	if got := r.header.Get("Idempotent-Replayed"); (got == "true") != c.replayed || (got != "" && got != "true") {
		t.Errorf("Idempotent-Replayed = %q, want replayed=%v", got, c.replayed)
	}
	f.conform(t, c, cl, r)
	if c.check != nil {
		c.check(t, f, r)
	}
}

// TestAPIConformsToOpenAPI sends real requests to the real server, wired
// as `overage serve` wires it, and validates every request and response
// against api/openapi.yaml. It covers every documented status of every
// operation; a status, operation or problem type that drifts from the
// document fails here.
func TestAPIConformsToOpenAPI(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	now := time.Now().UTC()
	alice := func(f *fixture) string { return f.alice.APIKey }
	evt := func(fields string) string {
		return `{"user_id":"u_42","model_id":"gpt-4o",` + fields + `}`
	}
	webhookEvent := stripeEvent("evt_apitest_1")
	bigEvent := `{"id":"evt_apitest_big","object":"event","type":"customer.updated","pad":"` + strings.Repeat("a", 1<<20) + `"}`
	var correctionBody []byte
	padded := `{"user_id":"u_42","model_id":"gpt-4o","input_tokens":1,"output_tokens":1` + strings.Repeat(" ", 65<<10) + `}`

	cases := []apiCase{
		// POST /v1/usage-events: new, replayed, duplicate.
		{name: "202 new event", status: 202,
			req: func(f *fixture) call { return post(alice(f), "k-1", f.body1) },
			check: func(t *testing.T, f *fixture, r *result) {
				m := r.json(t)
				if m["duplicate"] != false || m["billing_status"] != "pending" || m["tenant_id"] != f.alice.ID.String() {
					t.Fatalf("unexpected usage log: %s", r.body)
				}
				f.logID, f.firstBody = m["id"].(string), r.body
				evs := m["stripe_meter_events"].([]any)
				if len(evs) != 2 || evs[0].(map[string]any)["identifier"] != nil || evs[1].(map[string]any)["identifier"] != nil {
					t.Fatalf("stripe_meter_events = %v", evs)
				}
			}},
		{name: "202 replay, bare key", status: 202, replayed: true,
			req:   func(f *fixture) call { return post(alice(f), "k-1", f.body1) },
			check: sameBodyAs(func(f *fixture) []byte { return f.firstBody })},
		{name: "202 replay, structured-field key", status: 202, replayed: true,
			req:   func(f *fixture) call { return post(alice(f), `"k-1"`, f.body1) },
			check: sameBodyAs(func(f *fixture) []byte { return f.firstBody })},
		{name: "202 replay, body reordered (RFC 8785 fingerprint)", status: 202, replayed: true,
			req:   func(f *fixture) call { return post(alice(f), "k-1", f.body1Reordered) },
			check: sameBodyAs(func(f *fixture) []byte { return f.firstBody })},
		{name: "409 key reused with another body", status: 409, problem: "idempotency-key-reused",
			req:   func(f *fixture) call { return post(alice(f), "k-1", event(11, 5)) },
			check: noRetryAfter},
		// The meter operations are TestMeterAPIConformsToOpenAPI's; this
		// one answers meter-exists here too, creating nothing (the default
		// input meter has every model already).
		{name: "409 a second input meter of every model", status: 409, problem: "meter-exists",
			req: func(f *fixture) call {
				return jsonCall(http.MethodPost, "/v1/meters", `{"key":"every_input","event_name":"e","token_type":"input","models":["*"]}`)
			}},
		// Two request_ids of one MD5 digest: a real pair is hard to come
		// by, so for this case the database's md5 is shadowed by one that
		// ignores case (collideMD5) and "CHATCMPL-1" collides with
		// "chatcmpl-1" exactly as a real pair would.
		{name: "409 request_id with the digest of another", status: 409, problem: "request-id-digest-collision",
			before: func(t *testing.T, f *fixture) { collideMD5(t, f, true) },
			after:  func(t *testing.T, f *fixture) { collideMD5(t, f, false) },
			req: func(f *fixture) call {
				return post(alice(f), "k-collide", strings.Replace(f.body1, "chatcmpl-1", "CHATCMPL-1", 1))
			},
			check: func(t *testing.T, f *fixture, r *result) {
				var n int
				if err := f.db.QueryRow(context.Background(), `SELECT count(*) FROM usage_logs WHERE request_id = 'CHATCMPL-1'`).Scan(&n); err != nil || n != 0 {
					t.Fatalf("%d logs of the colliding request_id (%v), want none", n, err)
				}
			}},
		{name: "200 duplicate request_id under another key", status: 200,
			req: func(f *fixture) call { return post(alice(f), "k-2", f.body1) },
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); m["duplicate"] != true || m["id"] != f.logID {
					t.Fatalf("duplicate answer = %s", r.body)
				}
				f.dupBody = r.body
			}},
		{name: "200 duplicate replayed", status: 200, replayed: true,
			req:   func(f *fixture) call { return post(alice(f), "k-2", f.body1) },
			check: sameBodyAs(func(f *fixture) []byte { return f.dupBody })},
		{name: "202 same key, another tenant", status: 202,
			req: func(f *fixture) call { return post(f.bob.APIKey, "k-1", event(10, 5)) },
			check: func(t *testing.T, f *fixture, r *result) {
				if r.json(t)["tenant_id"] != f.bob.ID.String() {
					t.Fatalf("another tenant's key answered: %s", r.body)
				}
			}},
		{name: "202 not billable, under the allowance", status: 202,
			req: func(f *fixture) call { return post(f.capped.APIKey, "k-capped", event(600, 300)) },
			check: func(t *testing.T, f *fixture, r *result) {
				m := r.json(t)
				if m["billing_status"] != "not_billable" || m["stripe_meter_events"] != nil {
					t.Fatalf("a log under the allowance: %s", r.body)
				}
				f.freeID = m["id"].(string)
			}},
		{name: "202 structured-field key with escapes", status: 202,
			req: func(f *fixture) call { return post(alice(f), `"a\"b\\c"`, event(12, 5)) }},
		{name: "202 replay of the escaped key sent bare", status: 202, replayed: true,
			req: func(f *fixture) call { return post(alice(f), `a"b\c`, event(12, 5)) }},
		{name: "202 Content-Type with charset", status: 202,
			req: func(f *fixture) call {
				c := post(alice(f), "k-charset", event(13, 5))
				c.header.Set("Content-Type", "application/json; charset=utf-8")
				return c
			}},

		// 400 idempotency-key-invalid.
		{name: "400 key missing", status: 400, problem: "idempotency-key-invalid", field: "Idempotency-Key", docRefuses: true,
			req: func(f *fixture) call { return post(alice(f), "", event(1, 1)) }},
		{name: "400 key too long", status: 400, problem: "idempotency-key-invalid", field: "Idempotency-Key", docRefuses: true,
			req: func(f *fixture) call { return post(alice(f), strings.Repeat("k", 256), event(1, 1)) }},
		{name: "400 key not ASCII", status: 400, problem: "idempotency-key-invalid", field: "Idempotency-Key", docRefuses: true,
			req: func(f *fixture) call { return post(alice(f), "clé", event(1, 1)) }},
		{name: "400 key broken structured-field string", status: 400, problem: "idempotency-key-invalid", field: "Idempotency-Key", docRefuses: true,
			req: func(f *fixture) call { return post(alice(f), `"abc`, event(1, 1)) }},
		{name: "400 key empty structured-field string", status: 400, problem: "idempotency-key-invalid", field: "Idempotency-Key", docRefuses: true,
			req: func(f *fixture) call { return post(alice(f), `""`, event(1, 1)) }},
		// The document says "exactly one such header", which a schema of
		// one header value cannot check: kin-openapi reads the first.
		{name: "400 key sent twice", status: 400, problem: "idempotency-key-invalid", field: "Idempotency-Key",
			req: func(f *fixture) call {
				c := post(alice(f), "k-a", event(1, 1))
				c.header.Add("Idempotency-Key", "k-b")
				return c
			}},

		// 400 malformed-request.
		{name: "400 not JSON", status: 400, problem: "malformed-request", field: "body", docRefuses: true,
			req: func(f *fixture) call { return post(alice(f), "k-m1", `{"user_id":`) }},
		{name: "400 not an object", status: 400, problem: "malformed-request", field: "body", docRefuses: true,
			req: func(f *fixture) call { return post(alice(f), "k-m2", `[1,2]`) }},
		{name: "400 empty body", status: 400, problem: "malformed-request", field: "body", docRefuses: true,
			req: func(f *fixture) call { return post(alice(f), "k-m3", "") }},
		{name: "400 unknown field", status: 400, problem: "malformed-request", field: "cost", docRefuses: true,
			req: func(f *fixture) call {
				return post(alice(f), "k-m4", evt(`"input_tokens":1,"output_tokens":1,"cost":3`))
			}},
		{name: "400 Content-Type not JSON (no 415)", status: 400, problem: "malformed-request", field: "Content-Type", docRefuses: true,
			req: func(f *fixture) call {
				c := post(alice(f), "k-m5", event(1, 1))
				c.header.Set("Content-Type", "text/plain")
				return c
			}},

		// 401, 403.
		{name: "401 no API key", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return post("", "k-u", event(1, 1)) }},
		{name: "401 unknown API key", status: 401, problem: "unauthorized",
			req: func(f *fixture) call { return post("ovg_nope", "k-u", event(1, 1)) }},
		{name: "401 revoked API key", status: 401, problem: "unauthorized",
			req: func(f *fixture) call { return post(f.revokedKey, "k-u", event(1, 1)) }},
		{name: "401 admin token is no tenant key", status: 401, problem: "unauthorized",
			req: func(f *fixture) call { return post(apitest.AdminToken, "k-u", event(1, 1)) }},
		{name: "401 Basic scheme", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call {
				c := post("", "k-u", event(1, 1))
				c.header.Set("Authorization", "Basic "+f.alice.APIKey)
				return c
			}},
		{name: "403 tenant_id of another tenant", status: 403, problem: "tenant-mismatch",
			req: func(f *fixture) call {
				return post(alice(f), "k-t", evt(`"input_tokens":1,"output_tokens":1,"tenant_id":"`+f.bob.ID.String()+`"`))
			}},

		// 413: the limit is in the document's words, not in a schema.
		{name: "413 body over 64 KiB", status: 413, problem: "payload-too-large",
			req: func(f *fixture) call { return post(alice(f), "k-big", padded) }},

		// 422 validation-failed.
		{name: "422 negative tokens", status: 422, problem: "validation-failed", field: "input_tokens", docRefuses: true,
			req: func(f *fixture) call { return post(alice(f), "k-v", event(-1, 5)) }},
		{name: "422 fractional tokens", status: 422, problem: "validation-failed", field: "input_tokens", docRefuses: true,
			req: func(f *fixture) call { return post(alice(f), "k-v", evt(`"input_tokens":1.5,"output_tokens":1`)) }},
		{name: "422 tokens as a string", status: 422, problem: "validation-failed", field: "input_tokens", docRefuses: true,
			req: func(f *fixture) call { return post(alice(f), "k-v", evt(`"input_tokens":"1","output_tokens":1`)) }},
		{name: "422 tokens above 2^40", status: 422, problem: "validation-failed", field: "output_tokens", docRefuses: true,
			req: func(f *fixture) call {
				return post(alice(f), "k-v", evt(`"input_tokens":1,"output_tokens":1099511627777`))
			}},
		// 1e3 is the integer 1000 to JSON Schema; the server wants a plain
		// integer literal, as the document says in words.
		{name: "422 tokens in exponent form", status: 422, problem: "validation-failed", field: "input_tokens",
			req: func(f *fixture) call { return post(alice(f), "k-v", evt(`"input_tokens":1e3,"output_tokens":1`)) }},
		{name: "422 both token counts zero", status: 422, problem: "validation-failed", field: "input_tokens", docRefuses: true,
			req: func(f *fixture) call { return post(alice(f), "k-v", event(0, 0)) }},
		{name: "422 timestamp in the future", status: 422, problem: "validation-failed", field: "timestamp",
			req: func(f *fixture) call {
				return post(alice(f), "k-v", evt(`"input_tokens":1,"output_tokens":1,"timestamp":"`+now.Add(time.Hour).Format(time.RFC3339)+`"`))
			}},
		{name: "422 timestamp older than 35 days", status: 422, problem: "validation-failed", field: "timestamp",
			req: func(f *fixture) call {
				return post(alice(f), "k-v", evt(`"input_tokens":1,"output_tokens":1,"timestamp":"`+now.Add(-40*24*time.Hour).Format(time.RFC3339)+`"`))
			}},
		{name: "422 timestamp not RFC 3339", status: 422, problem: "validation-failed", field: "timestamp", docRefuses: true,
			req: func(f *fixture) call {
				return post(alice(f), "k-v", evt(`"input_tokens":1,"output_tokens":1,"timestamp":"yesterday"`))
			}},
		{name: "422 required fields missing, all named", status: 422, problem: "validation-failed", field: "model_id", docRefuses: true,
			req: func(f *fixture) call { return post(alice(f), "k-v", `{"input_tokens":1,"output_tokens":1}`) },
			check: func(t *testing.T, f *fixture, r *result) {
				if !strings.Contains(string(r.body), `"field":"user_id"`) {
					t.Fatalf("user_id not named: %s", r.body)
				}
			}},
		{name: "422 tenant_id not a UUID", status: 422, problem: "validation-failed", field: "tenant_id", docRefuses: true,
			req: func(f *fixture) call {
				return post(alice(f), "k-v", evt(`"input_tokens":1,"output_tokens":1,"tenant_id":"alice"`))
			}},
		{name: "422 user_id over 255 characters", status: 422, problem: "validation-failed", field: "user_id", docRefuses: true,
			req: func(f *fixture) call {
				return post(alice(f), "k-v", `{"user_id":"`+strings.Repeat("u", 256)+`","model_id":"m","input_tokens":1,"output_tokens":1}`)
			}},

		// POST /v1/usage-events/batch.
		{name: "202 batch", status: 202,
			req: func(f *fixture) call {
				// b-1 is new; the body1 event was recorded above: a duplicate.
				return postBatch(alice(f), "b-1", batchOf(withRID("b-1", 5, 5), f.body1))
			},
			check: func(t *testing.T, f *fixture, r *result) {
				m := r.json(t)
				evs := m["events"].([]any)
				first, second := evs[0].(map[string]any), evs[1].(map[string]any)
				if m["created"] != 1.0 || m["duplicates"] != 1.0 || first["duplicate"] != false || first["index"] != 0.0 ||
					second["duplicate"] != true || second["id"] != f.logID || second["index"] != 1.0 {
					t.Fatalf("batch answer: %s", r.body)
				}
				f.batchBody = r.body
			}},
		{name: "202 batch replay", status: 202, replayed: true,
			req:   func(f *fixture) call { return postBatch(alice(f), "b-1", batchOf(withRID("b-1", 5, 5), f.body1)) },
			check: sameBodyAs(func(f *fixture) []byte { return f.batchBody })},
		{name: "409 batch key reused with another body", status: 409, problem: "idempotency-key-reused",
			req:   func(f *fixture) call { return postBatch(alice(f), "b-1", batchOf(withRID("b-1", 5, 5))) },
			check: noRetryAfter},
		{name: "400 batch not JSON", status: 400, problem: "malformed-request", field: "body", docRefuses: true,
			req: func(f *fixture) call { return postBatch(alice(f), "b-m", `{"events":[`) }},
		{name: "400 batch event with an unknown field", status: 400, problem: "malformed-request", field: "events[1].cost", docRefuses: true,
			req: func(f *fixture) call {
				return postBatch(alice(f), "b-m", batchOf(withRID("a", 1, 1), `{"request_id":"b","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":1,"cost":1}`))
			}},
		{name: "401 batch, unknown API key", status: 401, problem: "unauthorized",
			req: func(f *fixture) call { return postBatch("ovg_nope", "b-u", batchOf(withRID("a", 1, 1))) }},
		{name: "403 batch, tenant_id of another tenant", status: 403, problem: "tenant-mismatch",
			req: func(f *fixture) call {
				return postBatch(alice(f), "b-t", batchOf(`{"request_id":"a","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":1,"tenant_id":"`+f.bob.ID.String()+`"}`))
			}},
		{name: "413 batch over 1 MiB", status: 413, problem: "payload-too-large",
			req: func(f *fixture) call {
				return postBatch(alice(f), "b-big", batchOf(withRID("a", 1, 1))+strings.Repeat(" ", 1<<20))
			}},
		{name: "422 batch, a bad field of one event", status: 422, problem: "validation-failed", field: "events[1].input_tokens", docRefuses: true,
			req: func(f *fixture) call {
				return postBatch(alice(f), "b-v", batchOf(withRID("a", 1, 1), withRID("b", -1, 1)))
			}},
		{name: "422 batch, request_id repeated", status: 422, problem: "validation-failed", field: "events[0].request_id",
			req: func(f *fixture) call {
				return postBatch(alice(f), "b-v", batchOf(withRID("a", 1, 1), withRID("a", 2, 2)))
			},
			check: func(t *testing.T, f *fixture, r *result) {
				if !strings.Contains(string(r.body), `"field":"events[1].request_id"`) {
					t.Fatalf("the second index is not named: %s", r.body)
				}
			}},
		{name: "422 batch, request_id missing", status: 422, problem: "validation-failed", field: "events[0].request_id", docRefuses: true,
			req: func(f *fixture) call { return postBatch(alice(f), "b-v", batchOf(event(1, 1))) }},
		{name: "422 batch of more than 1,000 events", status: 422, problem: "validation-failed", field: "events", docRefuses: true,
			req: func(f *fixture) call {
				evs := make([]string, 1001)
				for i := range evs {
					evs[i] = withRID(fmt.Sprintf("r%d", i), 1, 1)
				}
				return postBatch(alice(f), "b-v", batchOf(evs...))
			}},

		// GET /v1/usage-events/{id}.
		{name: "200 usage log, owner", status: 200,
			req:   func(f *fixture) call { return get("/v1/usage-events/"+f.logID, alice(f)) },
			check: billingStatus("pending")},
		{name: "200 usage log, admin token", status: 200,
			req: func(f *fixture) call { return get("/v1/usage-events/"+f.logID, apitest.AdminToken) }},
		{name: "200 usage log, billed", status: 200,
			req: func(f *fixture) call { return get("/v1/usage-events/"+f.billedID, alice(f)) },
			check: func(t *testing.T, f *fixture, r *result) {
				billingStatus("billed")(t, f, r)
				m := r.json(t)
				if m["billed_at"] == nil || m["first_attempt_at"] == nil {
					t.Fatalf("billed log without billed_at/first_attempt_at: %s", r.body)
				}
				for _, e := range m["stripe_meter_events"].([]any) {
					e := e.(map[string]any)
					if e["accepted_at"] == nil || e["identifier"] != "usage-log:"+f.billedID+":"+e["dimension"].(string) {
						t.Fatalf("billed log with a meter event not accepted or not named: %s", r.body)
					}
				}
			}},
		{name: "200 usage log, failed", status: 200,
			req: func(f *fixture) call { return get("/v1/usage-events/"+f.failedID, alice(f)) },
			check: func(t *testing.T, f *fixture, r *result) {
				billingStatus("failed")(t, f, r)
				if r.json(t)["billing_message"] == nil {
					t.Fatalf("failed log without billing_message: %s", r.body)
				}
			}},
		{name: "200 usage log, needs_review", status: 200,
			req:   func(f *fixture) call { return get("/v1/usage-events/"+f.reviewID, apitest.AdminToken) },
			check: billingStatus("needs_review")},
		{name: "200 usage log, not_billable", status: 200,
			req:   func(f *fixture) call { return get("/v1/usage-events/"+f.freeID, f.capped.APIKey) },
			check: billingStatus("not_billable")},
		{name: "404 another tenant's usage log", status: 404, problem: "not-found",
			req: func(f *fixture) call { return get("/v1/usage-events/"+f.logID, f.bob.APIKey) }},
		{name: "404 unknown usage log", status: 404, problem: "not-found",
			req: func(f *fixture) call { return get("/v1/usage-events/0192f3a4-5b6c-7d8e-9f01-23456789abcd", alice(f)) }},
		{name: "404 usage log id not a UUID", status: 404, problem: "not-found", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/usage-events/not-a-uuid", alice(f)) }},
		{name: "401 usage log without credential", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/usage-events/"+f.logID, "") }},
		{name: "401 usage log with a wrong admin token", status: 401, problem: "unauthorized",
			req: func(f *fixture) call { return get("/v1/usage-events/"+f.logID, "admin-wrong") }},

		// Stream checkpoints on POST /v1/usage-events, and their listing.
		{name: "202 stream checkpoint", status: 202,
			req: func(f *fixture) call { return post(alice(f), "s:0", streamCheckpoint("s-api", 0, false, 10, 2)) },
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); m["stale"] != false || m["stream"].(map[string]any)["input_tokens"] != float64(10) {
					t.Fatalf("checkpoint answer = %s", r.body)
				}
			}},
		{name: "200 stale stream checkpoint", status: 200,
			req: func(f *fixture) call { return post(alice(f), "s:0-again", streamCheckpoint("s-api", 0, false, 10, 2)) },
			check: func(t *testing.T, f *fixture, r *result) {
				if r.json(t)["stale"] != true {
					t.Fatalf("stale checkpoint answer = %s", r.body)
				}
			}},
		{name: "422 non-final checkpoint lowers a total", status: 422, problem: "validation-failed", field: "input_tokens",
			req: func(f *fixture) call { return post(alice(f), "s:1", streamCheckpoint("s-api", 1, false, 5, 2)) }},
		{name: "202 final checkpoint lowers a total", status: 202,
			req: func(f *fixture) call { return post(alice(f), "s:2", streamCheckpoint("s-api", 2, true, 5, 4)) },
			check: func(t *testing.T, f *fixture, r *result) {
				if c, _ := r.json(t)["correction"].(map[string]any); c == nil || c["input_tokens"] != float64(-5) {
					t.Fatalf("final checkpoint answer = %s", r.body)
				}
			}},
		{name: "409 checkpoint after the final one", status: 409, problem: "stream-closed",
			req: func(f *fixture) call { return post(alice(f), "s:3", streamCheckpoint("s-api", 3, false, 50, 4)) }},
		{name: "200 a stream's logs and totals", status: 200,
			req: func(f *fixture) call { return get("/v1/usage-events?request_id=s-api", alice(f)) },
			check: func(t *testing.T, f *fixture, r *result) {
				m := r.json(t)
				if st := m["stream"].(map[string]any); st["input_tokens"] != float64(5) || st["closed"] != true || len(m["usage_events"].([]any)) != 3 {
					t.Fatalf("stream listing = %s", r.body)
				}
			}},
		{name: "200 a stream's logs, a page at a time", status: 200,
			req:   func(f *fixture) call { return get("/v1/usage-events?request_id=s-api&limit=2", alice(f)) },
			check: pagesAgree("/v1/usage-events?request_id=s-api", alice, "usage_events", "id", 2)},
		{name: "400 listing, NUL in request_id", status: 400, problem: "malformed-request", field: "request_id",
			req: func(f *fixture) call { return get("/v1/usage-events?request_id=s%00api", alice(f)) }},
		{name: "400 listing, limit not a number", status: 400, problem: "malformed-request", field: "limit", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/usage-events?request_id=s-api&limit=two", alice(f)) }},
		{name: "400 listing without request_id", status: 400, problem: "malformed-request", field: "request_id", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/usage-events", alice(f)) }},
		{name: "401 listing without credential", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/usage-events?request_id=s-api", "") }},
		{name: "404 listing of another tenant's request_id", status: 404, problem: "not-found",
			req: func(f *fixture) call { return get("/v1/usage-events?request_id=s-api", f.bob.APIKey) }},

		// POST /v1/usage-events/{id}/corrections.
		{name: "202 correction voids a usage log", status: 202,
			req: func(f *fixture) call { return correct(alice(f), "c-1", f.logID, 0, 0) },
			check: func(t *testing.T, f *fixture, r *result) {
				m := r.json(t)
				if m["kind"] != "correction" || m["corrects"] != f.logID || m["stripe_timestamp"] != "original" || m["billing_status"] != "pending" ||
					m["corrected_by"] != f.alice.APIKeyID.String() {
					t.Fatalf("correction answer = %s", r.body)
				}
				correctionBody = r.body
			}},
		{name: "202 correction replayed", status: 202, replayed: true,
			req:   func(f *fixture) call { return correct(alice(f), "c-1", f.logID, 0, 0) },
			check: sameBodyAs(func(*fixture) []byte { return correctionBody })},
		{name: "200 corrected usage log shows its corrections", status: 200,
			req: func(f *fixture) call { return get("/v1/usage-events/"+f.logID, alice(f)) },
			check: func(t *testing.T, f *fixture, r *result) {
				m := r.json(t)
				tot, _ := m["corrected_totals"].(map[string]any)
				if cs, _ := m["corrections"].([]any); len(cs) != 1 || tot["input_tokens"] != float64(0) || tot["output_tokens"] != float64(0) {
					t.Fatalf("corrected usage log = %s", r.body)
				}
			}},
		{name: "409 correction key reused with another body", status: 409, problem: "idempotency-key-reused",
			req: func(f *fixture) call { return correct(alice(f), "c-1", f.logID, 1, 0) }},
		{name: "400 correction without a key", status: 400, problem: "idempotency-key-invalid", field: "Idempotency-Key", docRefuses: true,
			req: func(f *fixture) call { return correct(alice(f), "", f.logID, 1, 0) }},
		{name: "401 correction without credential", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return correct("", "c-2", f.logID, 1, 0) }},
		{name: "404 correction of another tenant's log", status: 404, problem: "not-found",
			req: func(f *fixture) call { return correct(f.bob.APIKey, "c-2", f.logID, 1, 0) }},
		{name: "422 correction below zero", status: 422, problem: "validation-failed", field: "input_tokens", docRefuses: true,
			req: func(f *fixture) call { return correct(alice(f), "c-2", f.logID, -1, 0) }},
		{name: "202 correction by the admin token", status: 202,
			req: func(f *fixture) call { return correct(apitest.AdminToken, "c-3", f.logID, 2, 1) },
			check: func(t *testing.T, f *fixture, r *result) {
				if by := r.json(t)["corrected_by"]; by != "admin" {
					t.Fatalf("corrected_by %v, want admin", by)
				}
			}},
		{name: "403 correction of a closed period with the tenant's key", status: 403, problem: "period-closed",
			req: func(f *fixture) call { return correct(alice(f), "c-closed", f.closedID, 0, 0) }},
		{name: "202 correction of a closed period by the admin token", status: 202,
			req: func(f *fixture) call { return correct(apitest.AdminToken, "c-closed", f.closedID, 0, 0) },
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); m["corrected_by"] != "admin" || m["stripe_timestamp"] != "correction" {
					t.Fatalf("correction of a closed period = %s", r.body)
				}
			}},
		{name: "403 correction by a suspended tenant", status: 403, problem: "tenant-suspended",
			req: func(f *fixture) call { return correct(f.suspended.APIKey, "c-susp", f.suspendedID, 0, 0) }},

		// A suspended tenant records nothing, and reads what it recorded.
		{name: "403 usage event of a suspended tenant", status: 403, problem: "tenant-suspended",
			req: func(f *fixture) call { return post(f.suspended.APIKey, "k-susp", event(10, 5)) }},
		{name: "403 batch of a suspended tenant", status: 403, problem: "tenant-suspended",
			req: func(f *fixture) call {
				return postBatch(f.suspended.APIKey, "kb-susp", batchOf(withRID("b-susp", 10, 5)))
			}},
		{name: "200 a suspended tenant reads its log", status: 200,
			req: func(f *fixture) call { return get("/v1/usage-events/"+f.suspendedID, f.suspended.APIKey) }},
		{name: "503 lifting a suspension on a server without Stripe", status: 503, problem: "stripe-unavailable",
			req: func(f *fixture) call {
				return jsonCall(http.MethodPatch, "/v1/tenants/"+f.suspended.ID.String(), `{"stripe_customer_id":"cus_new"}`)
			},
			check: retryAfter},

		// Health.
		{name: "200 healthz", status: 200, req: func(f *fixture) call { return get("/healthz", "") }},
		{name: "200 readyz", status: 200, req: func(f *fixture) call { return get("/readyz", "") }},

		// POST /v1/webhooks/stripe.
		{name: "200 webhook, signed event stored", status: 200,
			req: func(f *fixture) call { return signedWebhook(webhookEvent) },
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); m["received"] != true || m["duplicate"] != false {
					t.Fatalf("webhook answer = %s", r.body)
				}
				var n int
				if err := f.db.QueryRow(context.Background(), `SELECT count(*) FROM stripe_webhook_events WHERE event_id = 'evt_apitest_1' AND account = 'platform'`).Scan(&n); err != nil || n != 1 {
					t.Fatalf("stored rows = %d, %v; want 1", n, err)
				}
			}},
		{name: "200 webhook, duplicate delivery", status: 200,
			req: func(f *fixture) call { return signedWebhook(webhookEvent) },
			check: func(t *testing.T, f *fixture, r *result) {
				if m := r.json(t); m["received"] != true || m["duplicate"] != true {
					t.Fatalf("duplicate webhook answer = %s", r.body)
				}
				var n int
				if err := f.db.QueryRow(context.Background(), `SELECT count(*) FROM stripe_webhook_events WHERE event_id = 'evt_apitest_1'`).Scan(&n); err != nil || n != 1 {
					t.Fatalf("stored rows = %d, %v; want 1", n, err)
				}
			}},
		{name: "400 webhook, unsigned", status: 400, problem: "invalid-signature", docRefuses: true,
			req: func(f *fixture) call { return stripeWebhook(stripeEvent("evt_apitest_unsigned"), "") }},
		{name: "400 webhook, stale signature (10 minutes old)", status: 400, problem: "invalid-signature",
			req: func(f *fixture) call {
				body := stripeEvent("evt_apitest_stale")
				return stripeWebhook(body, stripeSign(body, apitest.WebhookSecret, time.Now().Add(-10*time.Minute)))
			}},
		{name: "400 webhook, tampered body", status: 400, problem: "invalid-signature",
			req: func(f *fixture) call {
				body := stripeEvent("evt_apitest_tampered")
				return stripeWebhook(strings.Replace(body, "cus_alice", "cus_bob", 1), stripeSign(body, apitest.WebhookSecret, time.Now()))
			}},
		{name: "400 webhook, another secret", status: 400, problem: "invalid-signature",
			req: func(f *fixture) call {
				body := stripeEvent("evt_apitest_other")
				return stripeWebhook(body, stripeSign(body, "whsec_other", time.Now()))
			}},
		{name: "400 webhook, signed but no event id", status: 400, problem: "malformed-request", docRefuses: true,
			req: func(f *fixture) call { return signedWebhook(`{"object":"event","type":"customer.updated"}`) }},
		{name: "413 webhook over 1 MiB", status: 413, problem: "payload-too-large",
			req: func(f *fixture) call { return signedWebhook(bigEvent) }},
		{name: "503 webhook, STRIPE_WEBHOOK_SECRET unset", status: 503, problem: "webhooks-disabled",
			req: func(f *fixture) call {
				c := signedWebhook(stripeEvent("evt_apitest_disabled"))
				c.base = f.noSecret.URL
				return c
			},
			check: retryAfter},

		// Operator endpoints.
		{name: "200 metrics, Prometheus text", status: 200,
			req: func(f *fixture) call { return get("/metrics", "") },
			check: func(t *testing.T, f *fixture, r *result) {
				if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
					t.Fatalf("Content-Type = %q, want text/plain", ct)
				}
				// The gauges come from a read of PostgreSQL under a 5 s
				// timeout, whose failure /metrics reports as
				// overage_backlog_scrape_ok 0 for BacklogCacheTTL; on a
				// loaded machine the first read can miss it, so the
				// scrape is repeated until the gauge is there.
				polltest.Until(t, "the backlog gauge in /metrics", 60*time.Second, func() bool {
					if strings.Contains(string(r.body), "overage_pending_usage_logs") {
						return true
					}
					if again, err := f.send(context.Background(), get("/metrics", "")); err == nil {
						r = again
					}
					return false
				})
			}},
		{name: "401 River UI without token", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return get("/riverui/", "") }},
		{name: "401 River UI with a tenant key", status: 401, problem: "unauthorized",
			req: func(f *fixture) call { return get("/riverui/", alice(f)) }},
		{name: "200 River UI with the admin token", status: 200,
			req: func(f *fixture) call { return get("/riverui/", apitest.AdminToken) },
			check: func(t *testing.T, f *fixture, r *result) {
				if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
					t.Fatalf("Content-Type = %q, want text/html", ct)
				}
			}},
		riverUICases[0], riverUICases[1], riverUICases[2], riverUICases[3], riverUICases[4],

		// Paths and methods the document does not list.
		{name: "405 DELETE /v1/usage-events", status: 405, problem: "method-not-allowed", undocumented: "MethodNotAllowed",
			req: func(f *fixture) call {
				return call{method: http.MethodDelete, path: "/v1/usage-events", bearer: alice(f)}
			}},
		{name: "405 PUT /v1/usage-events", status: 405, problem: "method-not-allowed", undocumented: "MethodNotAllowed",
			req: func(f *fixture) call { return call{method: http.MethodPut, path: "/v1/usage-events", bearer: alice(f)} }},
		{name: "405 PUT /healthz", status: 405, problem: "method-not-allowed", undocumented: "MethodNotAllowed",
			req: func(f *fixture) call { return call{method: http.MethodPut, path: "/healthz"} }},
		{name: "404 unknown path", status: 404, problem: "not-found", undocumented: "NotFound",
			req: func(f *fixture) call { return get("/v1/nope", alice(f)) }},

		// GET /v1/billing/status.
		{name: "200 billing status", status: 200,
			req:   func(f *fixture) call { return get("/v1/billing/status", apitest.AdminToken) },
			check: billingTotals},
		{name: "200 billing status of one tenant", status: 200,
			req: func(f *fixture) call {
				return get("/v1/billing/status?tenant_id="+f.alice.ID.String(), apitest.AdminToken)
			},
			check: func(t *testing.T, f *fixture, r *result) {
				billingTotals(t, f, r)
				if ts := r.json(t)["tenants"].([]any); len(ts) != 1 || ts[0].(map[string]any)["tenant_id"] != f.alice.ID.String() {
					t.Fatalf("tenants = %v, want alice alone", ts)
				}
			}},
		{name: "200 billing status, a page at a time", status: 200,
			req: func(f *fixture) call { return get("/v1/billing/status?limit=1", apitest.AdminToken) },
			check: func(t *testing.T, f *fixture, r *result) {
				pagesAgree("/v1/billing/status", adminBearer, "tenants", "tenant_id", 1)(t, f, r)
				whole, err := f.send(context.Background(), get("/v1/billing/status", apitest.AdminToken))
				if err != nil {
					t.Fatal(err)
				}
				if got, want := fmt.Sprint(r.json(t)["totals"]), fmt.Sprint(whole.json(t)["totals"]); got != want {
					t.Errorf("a page's totals %s, want every tenant's %s", got, want)
				}
			}},
		{name: "400 billing status, limit out of range", status: 400, problem: "malformed-request", field: "limit", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/billing/status?limit=1001", apitest.AdminToken) }},
		{name: "400 billing status, cursor not a next_cursor", status: 400, problem: "malformed-request", field: "cursor",
			req: func(f *fixture) call { return get("/v1/billing/status?cursor=abc", apitest.AdminToken) }},
		{name: "400 billing status, NUL in a query parameter", status: 400, problem: "malformed-request", field: "tenant_id", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/billing/status?tenant_id=%00", apitest.AdminToken) }},
		{name: "400 billing status, tenant_id not a UUID", status: 400, problem: "malformed-request", field: "tenant_id", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/billing/status?tenant_id=alice", apitest.AdminToken) }},
		{name: "404 billing status, unknown tenant", status: 404, problem: "not-found",
			req: func(f *fixture) call {
				return get("/v1/billing/status?tenant_id=0192f3a4-5b6c-7d8e-9f01-23456789abcd", apitest.AdminToken)
			}},
		{name: "401 billing status without token", status: 401, problem: "unauthorized", docRefuses: true,
			req: func(f *fixture) call { return get("/v1/billing/status", "") }},
		{name: "401 billing status with a tenant key", status: 401, problem: "unauthorized",
			req: func(f *fixture) call { return get("/v1/billing/status", alice(f)) }},

		// 429 tenant-busy: on a server with TENANT_MAX_INFLIGHT=1, one of
		// alice's batches waits for usage_logs, which the test has locked;
		// every other request of hers is refused at once.
		{name: "429 tenant busy, single event", status: 429, problem: "tenant-busy",
			before: startInflightCall(func(f *fixture) call {
				return onBusy(f, postBatch(f.alice.APIKey, "busy-hold", batchOf(withRID("busy-hold", 1, 1))))
			}),
			req:   func(f *fixture) call { return onBusy(f, post(alice(f), "busy-1", event(1, 1))) },
			check: retryAfter},
		{name: "429 tenant busy, batch", status: 429, problem: "tenant-busy",
			req: func(f *fixture) call {
				return onBusy(f, postBatch(alice(f), "busy-2", batchOf(withRID("busy-2", 1, 1))))
			},
			check: retryAfter},
		{name: "429 tenant busy, correction", status: 429, problem: "tenant-busy",
			req:   func(f *fixture) call { return onBusy(f, correct(alice(f), "busy-3", f.logID, 1, 1)) },
			check: retryAfter},
		{name: "429 tenant busy, usage log", status: 429, problem: "tenant-busy",
			req:   func(f *fixture) call { return onBusy(f, get("/v1/usage-events/"+f.logID, alice(f))) },
			check: retryAfter},
		{name: "429 tenant busy, listing", status: 429, problem: "tenant-busy",
			req:   func(f *fixture) call { return onBusy(f, get("/v1/usage-events?request_id=s-api", alice(f))) },
			check: retryAfter,
			after: func(t *testing.T, f *fixture) {
				if err := f.lockTx.Rollback(context.Background()); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "202 the busy tenant's batch completes", status: 202, awaitInflight: true},
		{name: "202 the refused event, once the tenant is free", status: 202,
			req: func(f *fixture) call { return onBusy(f, post(alice(f), "busy-1", event(1, 1))) }},

		// 409 in progress: the first request with a key holds it while it
		// waits for usage_logs, which the test has locked.
		{name: "409 in progress, same body", status: 409, problem: "idempotency-key-in-progress",
			before: startInflight("k-inflight", event(21, 1)),
			req:    func(f *fixture) call { return post(alice(f), "k-inflight", event(21, 1)) },
			check:  retryAfter},
		// In flight, the first request's body is not yet visible, so a
		// different body is in progress too; key reuse is reported once
		// the first request has completed (next cases).
		{name: "409 in progress, another body", status: 409, problem: "idempotency-key-in-progress",
			req:   func(f *fixture) call { return post(alice(f), "k-inflight", event(22, 1)) },
			check: retryAfter,
			after: func(t *testing.T, f *fixture) {
				if err := f.lockTx.Rollback(context.Background()); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "202 the first request completes", status: 202, awaitInflight: true},
		{name: "409 key reused after completion", status: 409, problem: "idempotency-key-reused",
			req:   func(f *fixture) call { return post(alice(f), "k-inflight", event(22, 1)) },
			check: noRetryAfter},
		{name: "202 replay after completion", status: 202, replayed: true,
			req: func(f *fixture) call { return post(alice(f), "k-inflight", event(21, 1)) }},
		{name: "409 batch in progress", status: 409, problem: "idempotency-key-in-progress",
			before: startInflightCall(func(f *fixture) call { return postBatch(f.alice.APIKey, "b-inflight", batchOf(withRID("b-in", 3, 3))) }),
			req:    func(f *fixture) call { return postBatch(alice(f), "b-inflight", batchOf(withRID("b-in", 3, 3))) },
			check:  retryAfter,
			after: func(t *testing.T, f *fixture) {
				if err := f.lockTx.Rollback(context.Background()); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "202 the first batch completes", status: 202, awaitInflight: true},

		// 500: the tables are renamed away, an unexpected database error.
		{name: "500 ingest, internal error", status: 500, problem: "internal",
			before: renameTables("", "_hidden"),
			req:    func(f *fixture) call { return post(alice(f), "k-500", event(1, 1)) }},
		{name: "500 batch, internal error", status: 500, problem: "internal",
			req: func(f *fixture) call { return postBatch(alice(f), "b-500", batchOf(withRID("b-500", 1, 1))) }},
		{name: "500 usage log, internal error", status: 500, problem: "internal",
			req: func(f *fixture) call { return get("/v1/usage-events/"+f.logID, alice(f)) }},
		{name: "500 listing, internal error", status: 500, problem: "internal",
			req: func(f *fixture) call { return get("/v1/usage-events?request_id=s-api", alice(f)) }},
		{name: "500 correction, internal error", status: 500, problem: "internal",
			req: func(f *fixture) call { return correct(alice(f), "c-500", f.logID, 3, 3) }},
		{name: "500 webhook, internal error", status: 500, problem: "internal",
			req: func(f *fixture) call { return signedWebhook(stripeEvent("evt_apitest_500")) }},
		{name: "500 billing status, internal error", status: 500, problem: "internal",
			req:   func(f *fixture) call { return get("/v1/billing/status", apitest.AdminToken) },
			after: renameTables("_hidden", "")},
		{name: "202 the key of a 500 was not stored", status: 202,
			req: func(f *fixture) call { return post(alice(f), "k-500", event(1, 1)) }},

		// 503: the database is unreachable.
		{name: "503 ingest, database down", status: 503, problem: "service-unavailable",
			before: func(t *testing.T, f *fixture) { f.proxy.SetDown(true) },
			req:    func(f *fixture) call { return post(alice(f), "k-down", event(5, 5)) },
			check:  retryAfter},
		{name: "503 batch, database down", status: 503, problem: "service-unavailable",
			req:   func(f *fixture) call { return postBatch(alice(f), "b-down", batchOf(withRID("b-down", 1, 1))) },
			check: retryAfter},
		{name: "503 listing, database down", status: 503, problem: "service-unavailable",
			req:   func(f *fixture) call { return get("/v1/usage-events?request_id=s-api", alice(f)) },
			check: retryAfter},
		{name: "503 correction, database down", status: 503, problem: "service-unavailable",
			req:   func(f *fixture) call { return correct(alice(f), "c-down", f.logID, 3, 3) },
			check: retryAfter},
		{name: "503 usage log, database down", status: 503, problem: "service-unavailable",
			req:   func(f *fixture) call { return get("/v1/usage-events/"+f.logID, alice(f)) },
			check: retryAfter},
		{name: "503 usage log as admin, database down", status: 503, problem: "service-unavailable",
			req:   func(f *fixture) call { return get("/v1/usage-events/"+f.logID, apitest.AdminToken) },
			check: retryAfter},
		{name: "503 readyz, database down", status: 503, problem: "service-unavailable",
			req: func(f *fixture) call { return get("/readyz", "") }},
		{name: "200 healthz, database down", status: 200,
			req: func(f *fixture) call { return get("/healthz", "") }},
		{name: "503 webhook, database down", status: 503, problem: "service-unavailable",
			req:   func(f *fixture) call { return signedWebhook(stripeEvent("evt_apitest_down")) },
			check: retryAfter},
		{name: "503 billing status, database down", status: 503, problem: "service-unavailable",
			req:   func(f *fixture) call { return get("/v1/billing/status", apitest.AdminToken) },
			check: retryAfter,
			after: func(t *testing.T, f *fixture) { f.proxy.SetDown(false) }},
		{name: "202 the key of a 503 was not stored", status: 202,
			req: func(f *fixture) call { return post(alice(f), "k-down", event(5, 5)) }},
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

	// Every documented status of every operation was exercised, and every
	// documented problem type answered: a response added to the document
	// without a case here, or a case lost, fails.
	for path, item := range f.doc.Paths.Map() {
		for method, op := range item.Operations() {
			if slices.Contains(op.Tags, "tenants") || slices.Contains(op.Tags, "integrations") || slices.Contains(op.Tags, "meters") || slices.Contains(op.Tags, "alerts") {
				continue // TestTenantAPIConformsToOpenAPI, TestLiteLLMAPIConformsToOpenAPI, TestMeterAPIConformsToOpenAPI, TestAlertsAPIConformsToOpenAPI
			}
			for status := range op.Responses.Map() {
				if !f.seen[op.OperationID][status] {
					t.Errorf("%s %s (%s): documented status %s was not exercised", method, path, op.OperationID, status)
				}
			}
		}
	}
	for slug := range f.problemStatus {
		if !f.emitted[slug] {
			t.Errorf("problem type %s is documented but no case produced it", slug)
		}
	}
}

// startInflight locks usage_logs and starts a request with key and body
// for alice; it returns once that request holds its key and waits for
// the lock. The wait is on a database condition, not on time.
func startInflight(key, body string) func(t *testing.T, f *fixture) {
	return startInflightCall(func(f *fixture) call { return post(f.alice.APIKey, key, body) })
}

// startInflightCall is startInflight for any ingest request.
func startInflightCall(req func(f *fixture) call) func(t *testing.T, f *fixture) {
	return func(t *testing.T, f *fixture) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		tx, err := f.db.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		if _, err := tx.Exec(ctx, `LOCK TABLE usage_logs IN SHARE MODE`); err != nil {
			t.Fatal(err)
		}
		f.lockTx = tx
		f.inflightCall = req(f)
		go func() {
			r, err := f.send(context.Background(), f.inflightCall)
			f.inflight <- inflight{res: r, err: err}
		}()
		for {
			var waiting bool
			if err := f.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
				WHERE locktype = 'relation' AND NOT granted AND relation = 'usage_logs'::regclass
				AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&waiting); err != nil {
				t.Fatalf("waiting for the first request to block on usage_logs: %v", err)
			}
			if waiting {
				return
			}
			select {
			case in := <-f.inflight:
				t.Fatalf("the first request finished while usage_logs was locked: %+v", in)
			default:
			}
		}
	}
}

// renameTables renames the tables a request reads, from name+from to
// name+to; a table that does not exist (yet) is left alone.
func renameTables(from, to string) func(t *testing.T, f *fixture) {
	return func(t *testing.T, f *fixture) {
		for _, name := range []string{"idempotency_keys", "usage_logs", "billing_counters", "stripe_webhook_events"} {
			if _, err := f.db.Exec(context.Background(), fmt.Sprintf(`ALTER TABLE IF EXISTS %s%s RENAME TO %s%s`, name, from, name, to)); err != nil {
				t.Fatalf("rename %s%s: %v", name, from, err)
			}
		}
	}
}

func sameBodyAs(want func(f *fixture) []byte) func(t *testing.T, f *fixture, r *result) {
	return func(t *testing.T, f *fixture, r *result) {
		if !bytes.Equal(r.body, want(f)) {
			t.Fatalf("replay differs from the stored answer:\n%s\n%s", r.body, want(f))
		}
	}
}

func billingStatus(want string) func(t *testing.T, f *fixture, r *result) {
	return func(t *testing.T, f *fixture, r *result) {
		if got := r.json(t)["billing_status"]; got != want {
			t.Fatalf("billing_status = %v, want %s: %s", got, want, r.body)
		}
	}
}

func retryAfter(t *testing.T, _ *fixture, r *result) {
	if n, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || n < 1 {
		t.Fatalf("Retry-After = %q, want whole seconds >= 1", r.header.Get("Retry-After"))
	}
}

func noRetryAfter(t *testing.T, _ *fixture, r *result) {
	if v := r.header.Get("Retry-After"); v != "" {
		t.Fatalf("Retry-After = %q on an answer no retry fixes", v)
	}
}

// billingTotals checks that the totals are the sums of the tenants and
// that every usage log is counted.
func billingTotals(t *testing.T, f *fixture, r *result) {
	var rep struct {
		Tenants []map[string]any
		Totals  map[string]any
	}
	if err := json.Unmarshal(r.body, &rep); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"usage_logs", "billed", "pending", "not_billable", "needs_review", "failed",
		"overage_input_tokens", "overage_output_tokens", "billed_input_tokens", "billed_output_tokens"} {
		var sum float64
		for _, tn := range rep.Tenants {
			sum += tn[k].(float64)
		}
		if rep.Totals[k] != sum {
			t.Errorf("totals.%s = %v, want the tenants' sum %v", k, rep.Totals[k], sum)
		}
	}
	var logs float64
	q := `SELECT count(*)::float8 FROM usage_logs`
	args := []any{}
	if len(rep.Tenants) == 1 {
		q, args = q+` WHERE tenant_id = $1`, []any{rep.Tenants[0]["tenant_id"]}
	}
	if err := f.db.QueryRow(context.Background(), q, args...).Scan(&logs); err != nil {
		t.Fatal(err)
	}
	if rep.Totals["usage_logs"] != logs {
		t.Errorf("totals.usage_logs = %v, want %v (count of usage_logs)", rep.Totals["usage_logs"], logs)
	}
}

// onBusy sends c to the fixture's server with TENANT_MAX_INFLIGHT=1.
func onBusy(f *fixture, c call) call {
	c.base = f.busy.URL
	return c
}

// collideMD5 shadows (on) or restores the database's md5 for the usage log
// partition holding f.logID: its digest index is made again on an md5 that
// ignores case, and the server's connections are made again with a
// search_path that finds that md5 before pg_catalog's.
func collideMD5(t *testing.T, f *fixture, on bool) {
	t.Helper()
	ctx := context.Background()
	var part string
	if err := f.db.QueryRow(ctx, `SELECT tableoid::regclass::text FROM usage_logs WHERE id = $1`, f.logID).Scan(&part); err != nil {
		t.Fatal(err)
	}
	md5, path := "pg_catalog.md5", `RESET search_path`
	if on {
		md5, path = "collide.md5", `SET search_path = collide, pg_catalog, public`
	}
	for _, q := range []string{
		`CREATE SCHEMA IF NOT EXISTS collide`,
		`CREATE OR REPLACE FUNCTION collide.md5(text) RETURNS text IMMUTABLE STRICT LANGUAGE sql AS $$ SELECT pg_catalog.md5(lower($1)) $$`,
		fmt.Sprintf(`DROP INDEX %s_request_key`, part),
		fmt.Sprintf(`CREATE UNIQUE INDEX %[1]s_request_key ON %[1]s ((%[2]s(tenant_id::text || request_id)::uuid)) WHERE request_id IS NOT NULL`, part, md5),
		fmt.Sprintf(`DO $$ BEGIN EXECUTE format('ALTER DATABASE %%I %s', current_database()); END $$`, path),
	} {
		if _, err := f.db.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	f.srv.Pool.Reset()
}
