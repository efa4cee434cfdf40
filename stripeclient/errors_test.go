package stripeclient_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/overage-billing/overage/stripeclient"
)

const ourKey = "usage-log:018f2a:input"

func stripeErrorBody(typ, code, msg string) string {
	s := `{"error":{"type":"` + typ + `","message":"` + msg + `"`
	if code != "" {
		s += `,"code":"` + code + `"`
	}
	return s + `}}`
}

// answerWith serves one canned answer with a Request-Id, as Stripe would.
func answerWith(status int, body string, headers ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Request-Id", "req_canned")
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}
}

// hang never answers. It drains the body first: net/http notices a client
// hanging up (and cancels the request's context) only once the body is
// read, and httptest.Server.Close waits for every handler to return.
func hang(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	<-r.Context().Done()
}

// TestErrorMapping pins the classification a report job acts on: retry
// (with the same key) or give up and mark the log failed. Each case also
// checks that exactly one request went out: stripe-go's own retries are off
// by default, so the job's backoff is the only retry policy.
func TestErrorMapping(t *testing.T) {
	t.Parallel()
	type want struct {
		kind       stripeclient.Kind // 0: success expected
		status     int
		code       string
		typ        string
		msgPrefix  string
		retryAfter time.Duration
		result     stripeclient.Result
	}
	cases := []struct {
		name    string
		handler http.HandlerFunc
		ctx     time.Duration // a deadline on the call, if any
		timeout time.Duration // an http.Client timeout, if any
		want    want
	}{
		{"500", answerWith(500, stripeErrorBody("api_error", "", "Something went wrong")),
			0, 0, want{kind: stripeclient.KindRetryable, status: 500, typ: "api_error", msgPrefix: "Something went wrong"}},
		{"502 from a proxy, not JSON", answerWith(502, "<html>Bad Gateway</html>"),
			0, 0, want{kind: stripeclient.KindRetryable, status: 502}},
		{"503 with Stripe-Should-Retry false", answerWith(503, stripeErrorBody("api_error", "", "Saved failure"), "Stripe-Should-Retry", "false"),
			0, 0, want{kind: stripeclient.KindPermanent, status: 503}},
		{"409 idempotency key in use", answerWith(409, stripeErrorBody("invalid_request_error", "idempotency_key_in_use", "in progress")),
			0, 0, want{kind: stripeclient.KindRetryable, status: 409, code: "idempotency_key_in_use"}},
		{"429 rate_limit with Retry-After", answerWith(429, stripeErrorBody("invalid_request_error", "rate_limit", "Too many"), "Retry-After", "3"),
			0, 0, want{kind: stripeclient.KindRetryable, status: 429, code: "rate_limit", retryAfter: 3 * time.Second}},
		{"429 lock_timeout", answerWith(429, stripeErrorBody("invalid_request_error", "lock_timeout", "Lock timeout")),
			0, 0, want{kind: stripeclient.KindRetryable, status: 429, code: "lock_timeout"}},
		{"400 invalid request", answerWith(400, stripeErrorBody("invalid_request_error", "parameter_missing", "Missing required param: event_name.")),
			0, 0, want{kind: stripeclient.KindPermanent, status: 400, code: "parameter_missing", typ: "invalid_request_error", msgPrefix: "Missing required param"}},
		{"400 idempotency_error", answerWith(400, stripeErrorBody("idempotency_error", "", "Keys for idempotent requests can only be used with the same parameters")),
			0, 0, want{kind: stripeclient.KindPermanent, status: 400, typ: "idempotency_error"}},
		{"400 with Stripe-Should-Retry false", answerWith(400, stripeErrorBody("invalid_request_error", "", "No such customer: 'cus_x'"), "Stripe-Should-Retry", "false"),
			0, 0, want{kind: stripeclient.KindPermanent, status: 400, msgPrefix: "No such customer"}},
		{"400 with Stripe-Should-Retry true", answerWith(400, stripeErrorBody("invalid_request_error", "", "try again"), "Stripe-Should-Retry", "true"),
			0, 0, want{kind: stripeclient.KindRetryable, status: 400}},
		{"401", answerWith(401, stripeErrorBody("invalid_request_error", "", "Invalid API Key provided: sk_test_****1234")),
			0, 0, want{kind: stripeclient.KindPermanent, status: 401}},
		{"404 not JSON (wrong base URL)", answerWith(404, "404 page not found"),
			0, 0, want{kind: stripeclient.KindPermanent, status: 404}},
		{"already exists, our identifier", answerWith(400, stripeErrorBody("invalid_request_error", "", "An event already exists with identifier "+ourKey+"."), "Stripe-Should-Retry", "false"),
			0, 0, want{result: stripeclient.Result{AlreadyApplied: true, RequestID: "req_canned"}}},
		{"already exists, our identifier quoted", answerWith(400, stripeErrorBody("invalid_request_error", "", "An event already exists with identifier `"+ourKey+"`."), "Stripe-Should-Retry", "false"),
			0, 0, want{result: stripeclient.Result{AlreadyApplied: true, RequestID: "req_canned"}}},
		{"already exists, another identifier", answerWith(400, stripeErrorBody("invalid_request_error", "", "An event already exists with identifier usage-log:other:input."), "Stripe-Should-Retry", "false"),
			0, 0, want{kind: stripeclient.KindPermanent, status: 400}},
		{"already exists, an identifier extending ours", answerWith(400, stripeErrorBody("invalid_request_error", "", "An event already exists with identifier "+ourKey+"2."), "Stripe-Should-Retry", "false"),
			0, 0, want{kind: stripeclient.KindPermanent, status: 400}},
		{"200", answerWith(200, `{"object":"billing.meter_event","identifier":"`+ourKey+`"}`),
			0, 0, want{result: stripeclient.Result{RequestID: "req_canned"}}},
		{"200 replayed", answerWith(200, `{"object":"billing.meter_event"}`, "Idempotent-Replayed", "true"),
			0, 0, want{result: stripeclient.Result{Replayed: true, RequestID: "req_canned"}}},
		{"200 with an unreadable body", answerWith(200, `{"object":`),
			0, 0, want{kind: stripeclient.KindRetryable, status: 200}},
		{"connection dropped without an answer", func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		}, 0, 0, want{kind: stripeclient.KindRetryable}},
		{"context deadline during the call", hang,
			50 * time.Millisecond, 0, want{kind: stripeclient.KindRetryable}},
		{"http.Client timeout", hang,
			0, 50 * time.Millisecond, want{kind: stripeclient.KindRetryable}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				tc.handler(w, r)
			}))
			t.Cleanup(srv.Close)
			cfg := stripeclient.Config{SecretKey: secretKey, APIBase: srv.URL}
			if tc.timeout > 0 {
				cfg.HTTPClient = &http.Client{Timeout: tc.timeout}
			}
			client, err := stripeclient.New(cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			ctx := context.Background()
			if tc.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctx)
				defer cancel()
			}

			res, err := client.SendMeterEvent(ctx, event("cus_map", ourKey))

			if n := calls.Load(); n != 1 {
				t.Errorf("%d requests sent, want 1", n)
			}
			if tc.want.kind == 0 {
				if err != nil {
					t.Fatalf("got error %v, want %+v", err, tc.want.result)
				}
				if res != tc.want.result {
					t.Errorf("result %+v, want %+v", res, tc.want.result)
				}
				return
			}
			var se *stripeclient.Error
			if !errors.As(err, &se) {
				t.Fatalf("error %v (%T) is not a *stripeclient.Error", err, err)
			}
			if se.Kind != tc.want.kind || stripeclient.IsRetryable(err) != (tc.want.kind == stripeclient.KindRetryable) ||
				stripeclient.IsPermanent(err) != (tc.want.kind == stripeclient.KindPermanent) {
				t.Errorf("kind %v, want %v (%v)", se.Kind, tc.want.kind, err)
			}
			if se.HTTPStatus != tc.want.status {
				t.Errorf("status %d, want %d", se.HTTPStatus, tc.want.status)
			}
			if tc.want.code != "" && se.Code != tc.want.code {
				t.Errorf("code %q, want %q", se.Code, tc.want.code)
			}
			if tc.want.typ != "" && se.Type != tc.want.typ {
				t.Errorf("type %q, want %q", se.Type, tc.want.typ)
			}
			if !strings.HasPrefix(se.Message, tc.want.msgPrefix) || se.Message == "" {
				t.Errorf("message %q, want prefix %q", se.Message, tc.want.msgPrefix)
			}
			if tc.want.status != 0 && se.RequestID != "req_canned" {
				t.Errorf("request id %q, want Stripe's", se.RequestID)
			}
			if se.RetryAfter != tc.want.retryAfter {
				t.Errorf("RetryAfter %v, want %v", se.RetryAfter, tc.want.retryAfter)
			}
			if se.Err == nil {
				t.Errorf("the underlying error is not kept")
			}
			if tc.ctx > 0 && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("deadline error does not wrap context.DeadlineExceeded: %v", err)
			}
			if strings.Contains(err.Error(), secretKey) {
				t.Errorf("error text contains the secret key")
			}
		})
	}

	t.Run("connection refused", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		base := srv.URL
		srv.Close()
		client, err := stripeclient.New(stripeclient.Config{SecretKey: secretKey, APIBase: base})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		_, err = client.SendMeterEvent(context.Background(), event("cus_map", ourKey))
		if !stripeclient.IsRetryable(err) {
			t.Errorf("got %v, want a retryable error", err)
		}
	})
}
