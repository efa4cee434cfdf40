package emulator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overage-billing/overage/internal/testkit/fakeclock"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

const testKey = "sk_test_emulator"

type harness struct {
	t    *testing.T
	emu  *emulator.Emulator
	base string
	hc   *http.Client
}

func start(t *testing.T, opts emulator.Options) *harness {
	t.Helper()
	emu := emulator.New(opts)
	t.Cleanup(emu.Close)
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	// A fresh connection per request: net/http silently resends a request
	// carrying an Idempotency-Key when a reused connection drops, which
	// would hide the lost responses these tests inject.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	return &harness{t: t, emu: emu, base: base, hc: hc}
}

type answer struct {
	status int
	header http.Header
	body   []byte
	err    error // transport error: no answer
}

func (a answer) apiError(t *testing.T) (typ, code, msg, param string) {
	t.Helper()
	var e struct {
		Error struct {
			Type, Code, Message, Param string
		} `json:"error"`
	}
	if err := json.Unmarshal(a.body, &e); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, a.body)
	}
	return e.Error.Type, e.Error.Code, e.Error.Message, e.Error.Param
}

func (h *harness) do(ctx context.Context, apiKey, idemKey string, form url.Values) answer {
	h.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.base+"/v1/billing/meter_events", strings.NewReader(form.Encode()))
	if err != nil {
		h.t.Fatalf("NewRequest: %v", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	resp, err := h.hc.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{err: err}
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: body}
}

func (h *harness) post(idemKey string, form url.Values) answer {
	h.t.Helper()
	return h.do(context.Background(), testKey, idemKey, form)
}

func (h *harness) get(path string) answer {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodGet, h.base+path, nil)
	if err != nil {
		h.t.Fatalf("NewRequest: %v", err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := h.hc.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: body, err: err}
}

// formTime is every meterForm's timestamp: one instant, so two forms of
// the same event are the same parameters (a retry's), whichever second
// each is built in; a timestamp read per form differed across a second's
// boundary, and the emulator rightly answered the replay under the same
// key with idempotency_error.
var formTime = time.Now().Add(-time.Minute).Unix()

func meterForm(customer, identifier string, value int64) url.Values {
	return url.Values{
		"event_name":                  {"llm_input_tokens"},
		"identifier":                  {identifier},
		"timestamp":                   {fmt.Sprint(formTime)},
		"payload[stripe_customer_id]": {customer},
		"payload[value]":              {fmt.Sprint(value)},
	}
}

func TestMeterEventApplied(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{})
	form := meterForm("cus_a", "usage-log:1:input", 42)

	a := h.post("usage-log:1:input", form)
	if a.err != nil || a.status != http.StatusOK {
		t.Fatalf("got %d %v %s, want 200", a.status, a.err, a.body)
	}
	if a.header.Get("Request-Id") == "" {
		t.Errorf("no Request-Id header")
	}
	if a.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("first answer marked as replayed")
	}
	var ev struct {
		Object, EventName, Identifier string
		Payload                       map[string]string
		Livemode                      bool
		Timestamp, Created            int64
	}
	if err := json.Unmarshal(a.body, &ev); err != nil {
		t.Fatalf("body: %v", err)
	}
	if ev.Object != "billing.meter_event" || ev.Identifier != "usage-log:1:input" || ev.Livemode ||
		ev.Payload["stripe_customer_id"] != "cus_a" || ev.Payload["value"] != "42" ||
		fmt.Sprint(ev.Timestamp) != form.Get("timestamp") || ev.Created == 0 {
		t.Errorf("unexpected meter event %s", a.body)
	}

	if got := h.emu.Applied()[emulator.AppliedKey{Customer: "cus_a", EventName: "llm_input_tokens"}]; got != 42 {
		t.Errorf("applied total %d, want 42", got)
	}
	if n := h.emu.AppliedCount("usage-log:1:input"); n != 1 {
		t.Errorf("AppliedCount %d, want 1", n)
	}
	evs := h.emu.Events()
	if len(evs) != 1 || evs[0].IdempotencyKey != "usage-log:1:input" || evs[0].Value != 42 ||
		evs[0].Timestamp.Unix() != ev.Timestamp || evs[0].AppliedAt.IsZero() {
		t.Errorf("Events() = %+v", evs)
	}
	reqs := h.emu.Requests()
	if len(reqs) != 1 || reqs[0].Outcome != emulator.OutcomeApplied || reqs[0].Status != 200 ||
		reqs[0].IdempotencyKey != "usage-log:1:input" || reqs[0].Identifier != "usage-log:1:input" ||
		reqs[0].Customer != "cus_a" || reqs[0].EventName != "llm_input_tokens" || reqs[0].Value != 42 {
		t.Errorf("Requests() = %+v", reqs)
	}
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{APIKeys: []string{"sk_test_only_this_one_1234"}})
	form := meterForm("cus_a", "id-1", 1)

	for _, tc := range []struct{ name, key string }{
		{"no key", ""},
		{"wrong key", "sk_test_not_the_right_one_9876"},
	} {
		a := h.do(context.Background(), tc.key, "k-"+tc.name, form)
		if a.status != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", tc.name, a.status)
			continue
		}
		if a.header.Get("Request-Id") == "" {
			t.Errorf("%s: 401 without Request-Id", tc.name)
		}
		typ, _, msg, _ := a.apiError(t)
		if typ != "invalid_request_error" {
			t.Errorf("%s: type %q", tc.name, typ)
		}
		// Stripe masks the key it echoes; so must we, since test logs keep
		// response bodies.
		if tc.key != "" && strings.Contains(msg, tc.key) {
			t.Errorf("%s: message echoes the key: %q", tc.name, msg)
		}
	}
	if a := h.do(context.Background(), "sk_test_only_this_one_1234", "k-ok", form); a.status != http.StatusOK {
		t.Errorf("configured key: status %d %s", a.status, a.body)
	}
	if n := h.emu.AppliedCount("id-1"); n != 1 {
		t.Errorf("AppliedCount %d, want 1 (401s must apply nothing)", n)
	}
}

func TestIdempotentReplay(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{})
	form := meterForm("cus_a", "usage-log:2:input", 7)

	first := h.post("usage-log:2:input", form)
	second := h.post("usage-log:2:input", form)
	if first.status != 200 || second.status != 200 {
		t.Fatalf("statuses %d, %d; want 200, 200", first.status, second.status)
	}
	if second.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("second answer lacks Idempotent-Replayed: true")
	}
	if second.header.Get("Original-Request") != first.header.Get("Request-Id") {
		t.Errorf("Original-Request %q, want the first Request-Id %q", second.header.Get("Original-Request"), first.header.Get("Request-Id"))
	}
	if second.header.Get("Request-Id") == first.header.Get("Request-Id") {
		t.Errorf("replay reused the Request-Id")
	}
	if string(first.body) != string(second.body) {
		t.Errorf("replayed body differs:\n%s\n%s", first.body, second.body)
	}
	if n := h.emu.AppliedCount("usage-log:2:input"); n != 1 {
		t.Errorf("AppliedCount %d, want 1", n)
	}
}

func TestIdempotencyErrorOnChangedParameters(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{})
	if a := h.post("k1", meterForm("cus_a", "id-1", 7)); a.status != 200 {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	a := h.post("k1", meterForm("cus_a", "id-1", 8))
	if a.status != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", a.status)
	}
	if typ, _, _, _ := a.apiError(t); typ != "idempotency_error" {
		t.Errorf("type %q, want idempotency_error", typ)
	}
	if got := h.emu.Applied()[emulator.AppliedKey{Customer: "cus_a", EventName: "llm_input_tokens"}]; got != 7 {
		t.Errorf("applied %d, want 7", got)
	}
}

// holdInFlight starts a meter event that stays in processing (a long
// latency) until its context is cancelled, and returns once the emulator
// holds it.
func holdInFlight(t *testing.T, h *harness, idemKey string, form url.Values) (cancel func() answer) {
	t.Helper()
	h.emu.SetFaults(emulator.Faults{Latency: time.Hour})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan answer, 1)
	go func() { done <- h.do(ctx, testKey, idemKey, form) }()
	polltest.Until(t, "the first request to be in flight", 10*time.Second, func() bool { return h.emu.InFlight() == 1 })
	// Later requests must not be delayed; the held one keeps its latency.
	h.emu.SetFaults(emulator.Faults{})
	var once sync.Once
	var a answer
	return func() answer {
		once.Do(func() {
			stop()
			a = <-done
		})
		return a
	}
}

func TestKeyInUseWhileInFlight(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{})
	form := meterForm("cus_a", "id-1", 3)
	release := holdInFlight(t, h, "k1", form)

	a := h.post("k1", form)
	if a.status != http.StatusConflict {
		t.Fatalf("status %d, want 409 (%s)", a.status, a.body)
	}
	if typ, code, _, _ := a.apiError(t); typ != "invalid_request_error" || code != "idempotency_key_in_use" {
		t.Errorf("type/code %s/%s", typ, code)
	}

	if first := release(); first.err == nil {
		t.Errorf("held request answered %d after its client left", first.status)
	}
	polltest.Until(t, "the held request to finish", 10*time.Second, func() bool { return h.emu.InFlight() == 0 })
	if n := h.emu.AppliedCount("id-1"); n != 0 {
		t.Fatalf("AppliedCount %d after the client left mid-processing, want 0", n)
	}
	// Nothing was saved under the key, so it executes afresh.
	if a := h.post("k1", form); a.status != 200 || a.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("retry: %d replayed=%q", a.status, a.header.Get("Idempotent-Replayed"))
	}
	if n := h.emu.AppliedCount("id-1"); n != 1 {
		t.Errorf("AppliedCount %d, want 1", n)
	}
}

func TestConcurrentCallsForOneCustomerAndMeter(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{})
	release := holdInFlight(t, h, "k1", meterForm("cus_a", "id-1", 1))
	defer release()

	a := h.post("k2", meterForm("cus_a", "id-2", 1))
	if a.status != http.StatusTooManyRequests {
		t.Fatalf("same customer and meter: status %d, want 429 (%s)", a.status, a.body)
	}
	if _, code, _, _ := a.apiError(t); code != "rate_limit" {
		t.Errorf("code %q, want rate_limit", code)
	}
	if b := h.post("k3", meterForm("cus_b", "id-3", 1)); b.status != 200 {
		t.Errorf("other customer: status %d, want 200", b.status)
	}
	other := meterForm("cus_a", "id-4", 1)
	other.Set("event_name", "llm_output_tokens")
	if b := h.post("k4", other); b.status != 200 {
		t.Errorf("other meter: status %d, want 200", b.status)
	}
	// The 429 saved nothing: the same key goes through once the slot frees.
	release()
	polltest.Until(t, "the slot to free", 10*time.Second, func() bool { return h.emu.InFlight() == 0 })
	if b := h.post("k2", meterForm("cus_a", "id-2", 1)); b.status != 200 || b.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("retry after 429: status %d replayed=%q", b.status, b.header.Get("Idempotent-Replayed"))
	}
}

func TestIdentifierReuseUnderANewKey(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{})
	if a := h.post("k1", meterForm("cus_a", "usage-log:3:input", 5)); a.status != 200 {
		t.Fatalf("first: %d", a.status)
	}
	a := h.post("k2", meterForm("cus_a", "usage-log:3:input", 5))
	if a.status != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", a.status)
	}
	typ, _, msg, _ := a.apiError(t)
	if typ != "invalid_request_error" || msg != "An event already exists with identifier usage-log:3:input." {
		t.Errorf("type %q message %q", typ, msg)
	}
	if a.header.Get("Stripe-Should-Retry") != "false" {
		t.Errorf("Stripe-Should-Retry %q, want false", a.header.Get("Stripe-Should-Retry"))
	}
	// The answer is the endpoint's, so it is saved and replayed under k2.
	b := h.post("k2", meterForm("cus_a", "usage-log:3:input", 5))
	if b.status != 400 || b.header.Get("Idempotent-Replayed") != "true" || b.header.Get("Stripe-Should-Retry") != "false" {
		t.Errorf("replay: %d replayed=%q should-retry=%q", b.status, b.header.Get("Idempotent-Replayed"), b.header.Get("Stripe-Should-Retry"))
	}
	if n := h.emu.AppliedCount("usage-log:3:input"); n != 1 {
		t.Errorf("AppliedCount %d, want 1", n)
	}
}

func TestKeysAndIdentifiersAreScopedPerAPIKey(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{})
	a := h.do(context.Background(), "sk_test_account_one", "shared", meterForm("cus_a", "id-1", 1))
	b := h.do(context.Background(), "sk_test_account_two", "shared", meterForm("cus_b", "id-1", 2))
	if a.status != 200 || b.status != 200 || b.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("statuses %d, %d (replayed=%q); two accounts must not share keys", a.status, b.status, b.header.Get("Idempotent-Replayed"))
	}
}

func TestWindows(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(time.Now())
	h := start(t, emulator.Options{Now: clock.Now, KeyTTL: time.Hour, IdentifierTTL: 2 * time.Hour})
	form := meterForm("cus_a", "usage-log:4:input", 9)
	form.Set("timestamp", fmt.Sprint(clock.Now().Unix()))

	if a := h.post("usage-log:4:input", form); a.status != 200 {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	clock.Advance(90 * time.Minute)
	// The key is forgotten but the identifier is not: the resend is refused.
	a := h.post("usage-log:4:input", form)
	if a.status != 400 || a.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after KeyTTL: %d replayed=%q, want a fresh 400", a.status, a.header.Get("Idempotent-Replayed"))
	}
	if _, _, msg, _ := a.apiError(t); !strings.HasPrefix(msg, "An event already exists with identifier") {
		t.Errorf("message %q", msg)
	}
	clock.Advance(time.Hour)
	// Past both windows Stripe applies it again: the double billing the
	// pipeline's needs_review state exists to prevent.
	if a := h.post("usage-log:4:input", form); a.status != 200 {
		t.Fatalf("after IdentifierTTL: %d %s", a.status, a.body)
	}
	if n := h.emu.AppliedCount("usage-log:4:input"); n != 2 {
		t.Errorf("AppliedCount %d, want 2 past both windows", n)
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{
		Customers:     []string{"cus_known", "cus_failing"},
		FailCustomers: map[string]string{"cus_failing": "This customer has no active subscription."},
	})
	cases := []struct {
		name   string
		mutate func(url.Values)
		status int
		param  string
		code   string
	}{
		{"missing event_name", func(v url.Values) { v.Del("event_name") }, 400, "event_name", "parameter_missing"},
		{"missing customer", func(v url.Values) { v.Del("payload[stripe_customer_id]") }, 400, "payload[stripe_customer_id]", "parameter_missing"},
		{"missing value", func(v url.Values) { v.Del("payload[value]") }, 400, "payload[value]", "parameter_missing"},
		{"decimal value", func(v url.Values) { v.Set("payload[value]", "1.5") }, 400, "payload[value]", "parameter_invalid_integer"},
		{"word value", func(v url.Values) { v.Set("payload[value]", "ten") }, 400, "payload[value]", "parameter_invalid_integer"},
		{"unknown parameter", func(v url.Values) { v.Set("customer", "cus_known") }, 400, "customer", "parameter_unknown"},
		{"identifier too long", func(v url.Values) { v.Set("identifier", strings.Repeat("x", 101)) }, 400, "identifier", ""},
		{"timestamp too old", func(v url.Values) { v.Set("timestamp", fmt.Sprint(time.Now().Add(-36*24*time.Hour).Unix())) }, 400, "timestamp", ""},
		{"timestamp in the future", func(v url.Values) { v.Set("timestamp", fmt.Sprint(time.Now().Add(time.Hour).Unix())) }, 400, "timestamp", ""},
		{"unknown customer", func(v url.Values) { v.Set("payload[stripe_customer_id]", "cus_stranger") }, 400, "payload[stripe_customer_id]", "resource_missing"},
		{"failing customer", func(v url.Values) { v.Set("payload[stripe_customer_id]", "cus_failing") }, 400, "payload[stripe_customer_id]", ""},
	}
	for i, tc := range cases {
		form := meterForm("cus_known", fmt.Sprintf("id-%d", i), 1)
		tc.mutate(form)
		key := fmt.Sprintf("key-%d", i)
		a := h.post(key, form)
		if a.status != tc.status {
			t.Errorf("%s: status %d, want %d (%s)", tc.name, a.status, tc.status, a.body)
			continue
		}
		typ, code, msg, param := a.apiError(t)
		if typ != "invalid_request_error" || param != tc.param || code != tc.code || msg == "" {
			t.Errorf("%s: type %q code %q param %q message %q", tc.name, typ, code, param, msg)
		}
		// A validation failure is not saved: the same key with a valid
		// request executes.
		if b := h.post(key, meterForm("cus_known", fmt.Sprintf("id-%d", i), 1)); b.status != 200 {
			t.Errorf("%s: same key after the failure: %d %s", tc.name, b.status, b.body)
		}
	}
	h.emu.SetCustomerFailure("cus_known", "Customer is being deleted.")
	a := h.post("late", meterForm("cus_known", "late", 1))
	if _, _, msg, _ := a.apiError(t); a.status != 400 || msg != "Customer is being deleted." {
		t.Errorf("runtime failure knob: %d %q", a.status, msg)
	}
	h.emu.SetCustomerFailure("cus_known", "")
	if a := h.post("late", meterForm("cus_known", "late", 1)); a.status != 200 {
		t.Errorf("after clearing the failure: %d", a.status)
	}
}

func TestLostResponse(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{Faults: emulator.Faults{LostResponseRate: 1}})
	form := meterForm("cus_a", "usage-log:5:input", 11)

	if a := h.post("usage-log:5:input", form); a.err == nil {
		t.Fatalf("got an answer (%d) from a lost response", a.status)
	}
	if n := h.emu.AppliedCount("usage-log:5:input"); n != 1 {
		t.Fatalf("AppliedCount %d after a lost response, want 1", n)
	}
	// Replays are never lost: the fault models the first answer's trip.
	a := h.post("usage-log:5:input", form)
	if a.status != 200 || a.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d replayed=%q", a.status, a.header.Get("Idempotent-Replayed"))
	}
	if n := h.emu.AppliedCount("usage-log:5:input"); n != 1 {
		t.Errorf("AppliedCount %d, want 1", n)
	}
	reqs := h.emu.Requests()
	if len(reqs) != 2 || reqs[0].Outcome != emulator.OutcomeLostResponse || reqs[0].Status != 0 || reqs[1].Outcome != emulator.OutcomeReplayed {
		t.Errorf("Requests() = %+v", reqs)
	}
}

func TestServerErrorAndRateLimitFaultsApplyNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		faults  emulator.Faults
		status  int
		typ     string
		outcome string
	}{
		{emulator.Faults{ServerErrorRate: 1}, 500, "api_error", emulator.OutcomeFaultServerError},
		{emulator.Faults{RateLimitRate: 1}, 429, "invalid_request_error", emulator.OutcomeFaultRateLimit},
	} {
		h := start(t, emulator.Options{Faults: tc.faults})
		form := meterForm("cus_a", "id-1", 1)
		a := h.post("k1", form)
		if a.status != tc.status {
			t.Fatalf("status %d, want %d", a.status, tc.status)
		}
		if typ, _, _, _ := a.apiError(t); typ != tc.typ {
			t.Errorf("type %q, want %q", typ, tc.typ)
		}
		if n := h.emu.AppliedCount("id-1"); n != 0 {
			t.Errorf("AppliedCount %d, want 0", n)
		}
		h.emu.SetFaults(emulator.Faults{})
		if b := h.post("k1", form); b.status != 200 || b.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("after the fault: %d replayed=%q; the fault must not be saved", b.status, b.header.Get("Idempotent-Replayed"))
		}
		if got := h.emu.Requests()[0].Outcome; got != tc.outcome {
			t.Errorf("outcome %q, want %q", got, tc.outcome)
		}
	}
}

func TestBlackholedCustomer(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{Faults: emulator.Faults{BlackholeCustomers: []string{"cus_void"}}})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	a := h.do(ctx, testKey, "k1", meterForm("cus_void", "id-1", 1))
	if a.err == nil {
		t.Fatalf("black-holed request answered %d", a.status)
	}
	if n := h.emu.AppliedCount("id-1"); n != 0 {
		t.Errorf("AppliedCount %d, want 0", n)
	}
	polltest.Until(t, "the outcome to be recorded", 10*time.Second, func() bool {
		r := h.emu.Requests()
		return len(r) == 1 && r[0].Outcome == emulator.OutcomeBlackholed
	})
	if b := h.post("k2", meterForm("cus_other", "id-2", 1)); b.status != 200 {
		t.Errorf("other customer: %d", b.status)
	}
}

func TestCloseReleasesHeldRequests(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{Faults: emulator.Faults{BlackholeCustomers: []string{"cus_void"}}})
	done := make(chan answer, 1)
	go func() { done <- h.post("k1", meterForm("cus_void", "id-1", 1)) }()
	polltest.Until(t, "the request to be held", 10*time.Second, func() bool {
		r := h.emu.Requests()
		return len(r) == 1 && r[0].Outcome == emulator.OutcomeBlackholed
	})
	h.emu.Close()
	select {
	case a := <-done:
		if a.err == nil {
			t.Errorf("held request answered %d", a.status)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not release the held request")
	}
}

func TestSeededFaultsAreReproducible(t *testing.T) {
	t.Parallel()
	run := func(seed int64) []string {
		h := start(t, emulator.Options{Seed: seed, Faults: emulator.Faults{ServerErrorRate: 0.25, RateLimitRate: 0.25, LostResponseRate: 0.25}})
		for i := range 40 {
			h.post(fmt.Sprintf("k%d", i), meterForm(fmt.Sprintf("cus_%d", i), fmt.Sprintf("id-%d", i), 1))
		}
		var outcomes []string
		for _, r := range h.emu.Requests() {
			outcomes = append(outcomes, r.Outcome)
		}
		return outcomes
	}
	a, b, c := run(42), run(42), run(43)
	if strings.Join(a, ",") != strings.Join(b, ",") {
		t.Errorf("same seed, different faults:\n%v\n%v", a, b)
	}
	if strings.Join(a, ",") == strings.Join(c, ",") {
		t.Errorf("different seeds, same faults: %v", a)
	}
	seen := map[string]bool{}
	for _, o := range a {
		seen[o] = true
	}
	for _, want := range []string{emulator.OutcomeApplied, emulator.OutcomeLostResponse, emulator.OutcomeFaultServerError, emulator.OutcomeFaultRateLimit} {
		if !seen[want] {
			t.Errorf("40 requests at 25%% rates never produced %s: %v", want, a)
		}
	}
}

func TestControlEndpoints(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{})
	h.post("k1", meterForm("cus_a", "id-1", 4))
	h.post("k2", meterForm("cus_a", "id-2", 6))

	a := h.get("/_emulator/applied")
	var raw map[string][]map[string]any
	if err := json.Unmarshal(a.body, &raw); err != nil || len(raw["applied"]) != 1 || raw["applied"][0]["total"] != float64(10) {
		t.Errorf("applied: %v %s", err, a.body)
	}

	req, _ := http.NewRequest(http.MethodPost, h.base+"/_emulator/faults", strings.NewReader(`{"rate_limit_rate":1,"latency":"1ms"}`))
	resp, err := h.hc.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("POST faults: %v %v", err, resp)
	}
	resp.Body.Close()
	if f := h.emu.Faults(); f.RateLimitRate != 1 || f.Latency != time.Millisecond {
		t.Errorf("faults not applied: %+v", f)
	}
	if b := h.post("k3", meterForm("cus_a", "id-3", 1)); b.status != 429 {
		t.Errorf("after enabling 429s: %d", b.status)
	}
	if r := h.get("/_emulator/requests"); r.status != 200 || !strings.Contains(string(r.body), `"outcome":"fault_429"`) {
		t.Errorf("requests: %d %s", r.status, r.body)
	}
}

func TestUnknownRoute(t *testing.T) {
	t.Parallel()
	h := start(t, emulator.Options{})
	a := h.get("/v1/charges")
	if a.status != 404 || a.header.Get("Request-Id") == "" {
		t.Fatalf("status %d request-id %q", a.status, a.header.Get("Request-Id"))
	}
	if typ, _, _, _ := a.apiError(t); typ != "invalid_request_error" {
		t.Errorf("type %q", typ)
	}
}

// Stripe's live mode takes at most RateLimit meter event calls per second
// per account: a token bucket holding a tenth of a second's worth. Above
// it the answer is 429 rate_limit and nothing is applied or saved; another
// account is unaffected; the bucket refills with time.
func TestAccountRateLimit(t *testing.T) {
	t.Parallel()
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h := start(t, emulator.Options{RateLimit: 20, Now: clock}) // 2 calls per 100 ms
	var statuses []int
	for i := range 5 {
		a := h.post(fmt.Sprintf("rl-%d", i), meterForm(fmt.Sprintf("cus_rl%d", i), fmt.Sprintf("rl-%d", i), 1))
		statuses = append(statuses, a.status)
		if a.status == http.StatusTooManyRequests {
			if _, code, _, _ := a.apiError(t); code != "rate_limit" {
				t.Fatalf("429 with code %q, want rate_limit", code)
			}
		}
	}
	if fmt.Sprint(statuses) != "[200 200 429 429 429]" {
		t.Fatalf("statuses %v, want two calls through and the rest limited", statuses)
	}
	if n := len(h.emu.Events()); n != 2 {
		t.Fatalf("%d events applied, want 2", n)
	}
	limited := 0
	for _, r := range h.emu.Requests() {
		if r.Outcome == emulator.OutcomeRateLimited {
			limited++
		}
	}
	if limited != 3 {
		t.Fatalf("%d requests recorded as rate limited, want 3", limited)
	}
	// Another account has its own bucket.
	if a := h.do(context.Background(), "sk_test_other", "rl-other", meterForm("cus_rl0", "rl-other", 1)); a.status != http.StatusOK {
		t.Fatalf("another account's call: %d %s", a.status, a.body)
	}
	// A limited call saved nothing under its key: retried after the bucket
	// refills, it is applied.
	mu.Lock()
	now = now.Add(100 * time.Millisecond)
	mu.Unlock()
	if a := h.post("rl-2", meterForm("cus_rl2", "rl-2", 1)); a.status != http.StatusOK || a.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the refill: %d %s", a.status, a.body)
	}
}
