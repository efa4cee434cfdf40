// Package stripeclienttest holds the behavioural suite every Stripe backend
// this project talks to must pass (real Stripe, stripe-mock, the local
// emulator), in the style of River's riverdrivertest, and a helper that runs
// stripe-mock in-process.
//
// The suite sends exactly the meter event request the report worker sends,
// through stripeclient.Client, and checks it on the wire and in the answer.
// Because stripe-mock validates requests against Stripe's OpenAPI schema, a
// request shape Stripe would reject fails the suite against stripe-mock; the
// negative cases check that each backend really does reject such shapes, so
// a passing suite means something.
package stripeclienttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meter"
	"github.com/stripe/stripe-go/v79/billing/metereventsummary"
	"github.com/stripe/stripe-mock/embedded"
	"github.com/stripe/stripe-mock/server"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/stripeclient"
)

// StripeMockKey is a key stripe-mock accepts (it wants exactly three parts).
const StripeMockKey = "sk_test_123"

// The meter event names the worker uses by default (SPEC: configuration).
const (
	InputEventName  = overage.DefaultMeterInputEvent
	OutputEventName = overage.DefaultMeterOutputEvent
)

// Exercise runs the suite against the Stripe API at baseURL.
func Exercise(t *testing.T, baseURL, secretKey string) {
	t.Helper()

	// A correction that gives overage back is a meter event with a
	// negative value: both backends must take it as sent.
	t.Run("NegativeValueOfACorrection", func(t *testing.T) {
		t.Parallel()
		wire := &wireRecorder{}
		client := newClient(t, baseURL, secretKey, wire)
		ev := stripeclient.MeterEvent{
			EventName:  InputEventName,
			CustomerID: "cus_" + randomHex(t, 7),
			Value:      -250,
			Timestamp:  time.Now().Add(-time.Minute),
			Key:        "usage-log:" + randomHex(t, 16) + ":input",
		}
		if _, err := client.SendMeterEvent(context.Background(), ev); err != nil {
			t.Fatalf("SendMeterEvent with value %d: %v", ev.Value, err)
		}
		reqs := wire.all()
		if len(reqs) != 1 || reqs[0].status != http.StatusOK {
			t.Fatalf("want one request answered 200, got %d", len(reqs))
		}
		checkWorkerRequest(t, reqs[0], ev)
	})

	t.Run("MeterEventAsTheWorkerSendsIt", func(t *testing.T) {
		t.Parallel()
		for _, eventName := range []string{InputEventName, OutputEventName} {
			wire := &wireRecorder{}
			client := newClient(t, baseURL, secretKey, wire)
			ev := stripeclient.MeterEvent{
				EventName:  eventName,
				CustomerID: "cus_" + randomHex(t, 7),
				Value:      1234,
				Timestamp:  time.Now().Add(-time.Minute),
				Key:        "usage-log:" + randomHex(t, 16) + ":input",
			}
			res, err := client.SendMeterEvent(context.Background(), ev)
			if err != nil {
				t.Fatalf("SendMeterEvent(%s): %v", eventName, err)
			}
			if res.AlreadyApplied || res.Replayed {
				t.Errorf("first send of a fresh key: got %+v, want a plain acceptance", res)
			}
			if res.RequestID == "" {
				t.Errorf("no Request-Id in the answer")
			}

			reqs := wire.all()
			if len(reqs) != 1 {
				t.Fatalf("%d requests on the wire, want exactly 1", len(reqs))
			}
			checkWorkerRequest(t, reqs[0], ev)
			if reqs[0].status != http.StatusOK {
				t.Errorf("status %d, want 200", reqs[0].status)
			}
			var body struct {
				Object    string            `json:"object"`
				EventName string            `json:"event_name"`
				Payload   map[string]string `json:"payload"`
				Livemode  bool              `json:"livemode"`
			}
			if err := json.Unmarshal(reqs[0].respBody, &body); err != nil {
				t.Fatalf("answer is not JSON: %v: %s", err, reqs[0].respBody)
			}
			if body.Object != "billing.meter_event" {
				t.Errorf("object %q, want billing.meter_event", body.Object)
			}
			if body.Livemode {
				t.Errorf("livemode true against a test backend")
			}
		}
	})

	t.Run("RejectsShapesStripeRejects", func(t *testing.T) {
		t.Parallel()
		good := url.Values{
			"event_name":                  {InputEventName},
			"identifier":                  {"usage-log:" + randomHex(t, 16) + ":input"},
			"timestamp":                   {fmt.Sprint(time.Now().Add(-time.Minute).Unix())},
			"payload[stripe_customer_id]": {"cus_shape"},
			"payload[value]":              {"10"},
		}
		// Only shapes stripe-mock's schema check also rejects belong here;
		// which parameter an error names, and limits the schema does not
		// state (identifier length), are the emulator's own tests.
		cases := []struct {
			name   string
			mutate func(url.Values)
		}{
			{"missing event_name", func(v url.Values) { v.Del("event_name") }},
			{"missing payload", func(v url.Values) { v.Del("payload[stripe_customer_id]"); v.Del("payload[value]") }},
			{"unknown top-level parameter", func(v url.Values) { v.Set("customer", "cus_shape") }},
			{"value outside the payload", func(v url.Values) { v.Del("payload[value]"); v.Set("value", "10") }},
			{"timestamp not an integer", func(v url.Values) { v.Set("timestamp", "yesterday") }},
		}
		for _, tc := range cases {
			form := url.Values{}
			for k, v := range good {
				form[k] = slices.Clone(v)
			}
			tc.mutate(form)
			status, body := rawPost(t, baseURL, secretKey, "/v1/billing/meter_events", form)
			if status != http.StatusBadRequest {
				t.Errorf("%s: status %d, want 400 (body %s)", tc.name, status, body)
				continue
			}
			var e struct {
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
				t.Errorf("%s: not a Stripe error body: %s", tc.name, body)
			}
		}
		// And the unmutated form is accepted, so the failures above are
		// about the mutations.
		if status, body := rawPost(t, baseURL, secretKey, "/v1/billing/meter_events", good); status != http.StatusOK {
			t.Errorf("valid form: status %d (body %s)", status, body)
		}
	})

	t.Run("RequiresAnAPIKey", func(t *testing.T) {
		t.Parallel()
		status, body := rawPost(t, baseURL, "", "/v1/billing/meter_events", url.Values{"event_name": {InputEventName}})
		if status != http.StatusUnauthorized {
			t.Errorf("no key: status %d, want 401 (body %s)", status, body)
		}
	})

	t.Run("ReadsMetersAndSummaries", func(t *testing.T) {
		t.Parallel()
		client := newClient(t, baseURL, secretKey, nil)
		customer := "cus_" + randomHex(t, 7)
		if _, err := client.SendMeterEvent(context.Background(), stripeclient.MeterEvent{
			EventName: InputEventName, CustomerID: customer, Value: 5,
			Timestamp: time.Now().Add(-time.Minute), Key: "usage-log:" + randomHex(t, 16) + ":input",
		}); err != nil {
			t.Fatalf("SendMeterEvent: %v", err)
		}

		backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
			URL:               stripe.String(baseURL),
			MaxNetworkRetries: stripe.Int64(0),
			LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		})
		meters := meter.Client{B: backend, Key: secretKey}
		it := meters.List(&stripe.BillingMeterListParams{})
		var first *stripe.BillingMeter
		for it.Next() {
			m := it.BillingMeter()
			if m.ID == "" || m.EventName == "" || m.Object != "billing.meter" {
				t.Errorf("meter without id, event_name or object: %+v", m)
			}
			if first == nil {
				first = m
			}
		}
		if err := it.Err(); err != nil {
			t.Fatalf("listing meters: %v", err)
		}
		if first == nil {
			t.Fatalf("no meters listed")
		}

		day := time.Now().UTC().Truncate(24 * time.Hour)
		summaries := metereventsummary.Client{B: backend, Key: secretKey}
		sit := summaries.List(&stripe.BillingMeterEventSummaryListParams{
			ID:                  stripe.String(first.ID),
			Customer:            stripe.String(customer),
			StartTime:           stripe.Int64(day.Add(-24 * time.Hour).Unix()),
			EndTime:             stripe.Int64(day.Add(24 * time.Hour).Unix()),
			ValueGroupingWindow: stripe.String("day"),
		})
		for sit.Next() {
			s := sit.BillingMeterEventSummary()
			if s.Object != "billing.meter_event_summary" || s.ID == "" {
				t.Errorf("not a meter event summary: %+v", s)
			}
		}
		if err := sit.Err(); err != nil {
			t.Fatalf("listing event summaries: %v", err)
		}
	})
}

// checkWorkerRequest asserts the wire shape of a meter event sent for ev:
// our key in both places, and exactly the parameters of the SPEC.
func checkWorkerRequest(t *testing.T, r recorded, ev stripeclient.MeterEvent) {
	t.Helper()
	if r.method != http.MethodPost || r.path != "/v1/billing/meter_events" {
		t.Errorf("sent %s %s, want POST /v1/billing/meter_events", r.method, r.path)
	}
	if got := r.header.Get("Idempotency-Key"); got != ev.Key {
		t.Errorf("Idempotency-Key %q, want %q", got, ev.Key)
	}
	if !strings.HasPrefix(r.header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		t.Errorf("Content-Type %q", r.header.Get("Content-Type"))
	}
	want := url.Values{
		"event_name":                  {ev.EventName},
		"identifier":                  {ev.Key},
		"timestamp":                   {fmt.Sprint(ev.Timestamp.Unix())},
		"payload[stripe_customer_id]": {ev.CustomerID},
		"payload[value]":              {fmt.Sprint(ev.Value)},
	}
	if got := r.form.Encode(); got != want.Encode() {
		t.Errorf("form\n got %s\nwant %s", got, want.Encode())
	}
}

func newClient(t *testing.T, baseURL, key string, wire *wireRecorder) *stripeclient.Client {
	t.Helper()
	hc := &http.Client{Timeout: 30 * time.Second}
	if wire != nil {
		hc.Transport = wire
	}
	c, err := stripeclient.New(stripeclient.Config{SecretKey: key, APIBase: baseURL, HTTPClient: hc})
	if err != nil {
		t.Fatalf("stripeclient.New: %v", err)
	}
	return c
}

func rawPost(t *testing.T, baseURL, key, path string, form url.Values) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, baseURL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatalf("building request: %v", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Idempotency-Key", "suite-"+randomHex(t, 16))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading answer: %v", err)
	}
	return resp.StatusCode, body
}

func randomHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random: %v", err)
	}
	return hex.EncodeToString(b)
}

type recorded struct {
	method, path string
	header       http.Header
	form         url.Values
	status       int
	respBody     []byte
}

// wireRecorder is an http.RoundTripper that keeps what was really sent.
type wireRecorder struct {
	mu   sync.Mutex
	reqs []recorded
}

func (w *wireRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, fmt.Errorf("recording request body: %w", err)
		}
		_ = req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, fmt.Errorf("recorded body is not a form: %w", err)
	}
	rec := recorded{method: req.Method, path: req.URL.Path, header: req.Header.Clone(), form: form}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil {
		respBody, rerr := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if rerr != nil {
			return nil, fmt.Errorf("recording response body: %w", rerr)
		}
		resp.Body = io.NopCloser(bytes.NewReader(respBody))
		rec.status, rec.respBody = resp.StatusCode, respBody
	}
	w.mu.Lock()
	w.reqs = append(w.reqs, rec)
	w.mu.Unlock()
	return resp, err
}

func (w *wireRecorder) all() []recorded {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.reqs)
}

var stripeMock struct {
	once    sync.Once
	handler http.Handler
	err     error
}

// StartStripeMock serves stripe-mock (its embedded OpenAPI spec and
// fixtures, no strict version check) in-process on loopback for the life of
// the test and returns its base URL. Use StripeMockKey as the secret key.
func StartStripeMock(t testing.TB) string {
	t.Helper()
	// Loading the spec takes a while; stripe-mock is stateless, so one stub
	// server can answer every test.
	stripeMock.once.Do(func() {
		spec, err := server.LoadSpec(embedded.OpenAPISpec, "")
		if err != nil {
			stripeMock.err = fmt.Errorf("loading stripe-mock spec: %w", err)
			return
		}
		fixtures, err := server.LoadFixtures(embedded.OpenAPIFixtures, "")
		if err != nil {
			stripeMock.err = fmt.Errorf("loading stripe-mock fixtures: %w", err)
			return
		}
		stub, err := server.NewStubServer(fixtures, spec, false, false)
		if err != nil {
			stripeMock.err = fmt.Errorf("starting stripe-mock router: %w", err)
			return
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/", stub.HandleRequest)
		stripeMock.handler = &server.DoubleSlashFixHandler{Mux: mux}
	})
	if stripeMock.err != nil {
		t.Fatalf("stripe-mock: %v", stripeMock.err)
	}
	srv := httptest.NewServer(stripeMock.handler)
	t.Cleanup(srv.Close)
	return srv.URL
}
