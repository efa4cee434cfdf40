package webhooks_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stripe/stripe-go/v79/webhook"

	"github.com/overage-billing/overage/api"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/webhooks"
)

// FuzzWebhookPayload delivers a correctly signed payload (what a leaked
// secret or a Stripe bug could send) and the same bytes unsigned to the
// real handler on a real database, then applies what was stored. No
// payload gets a 5xx, and every stored event is applied or acknowledged
// with an error outcome: none blocks the events behind it.
func FuzzWebhookPayload(f *testing.F) {
	pool, _ := pgtest.NewPool(f)
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		f.Fatal(err)
	}
	h := webhooks.NewHandler(webhooks.HandlerConfig{Pool: pool, River: rc, Secret: secret})
	srv := httptest.NewServer(api.NewRouter(api.Config{DB: pool, Handlers: []api.Mounter{h}}))
	f.Cleanup(srv.Close)
	proc := webhooks.NewProcessor(pool, nil)

	for _, s := range []string{
		`{"id":"evt_1","type":"customer.subscription.updated","data":{"object":{"id":"sub_1","customer":"cus_1","status":"active","current_period_start":1764000000,"current_period_end":1766600000}}}`,
		`{"id":"evt_2","type":"customer.subscription.updated","data":{"object":{"id":"sub_1","customer":{"id":"cus_1"},"items":{"data":[{"current_period_start":9223372036854775807,"current_period_end":-9223372036854775808}]}}}}`,
		`{"id":"evt_3","type":"customer.subscription.created","data":{"object":{"id":"sub_\u0000","customer":"cus_\u0000","current_period_start":1,"current_period_end":2}}}`,
		`{"id":"evt_4","type":"customer.deleted","data":{"object":{"id":"cus_1"}}}`,
		`{"id":"evt_5","type":"customer.deleted","data":{"object":"cus_1"}}`,
		`{"id":"evt_6","type":"billing.meter.error_report_triggered","data":{"object":{"reason":{"error_count":1e400}}}}`,
		`{"id":"evt_7","type":"v1.billing.meter.error_report_triggered","related_object":{"id":"\ud800"}}`,
		`{"id":"evt_8","type":"x","account":"acct_1","created":-1,"livemode":true,"api_version":"\u0000"}`,
		`{"id":"evt_9","type":"customer.subscription.deleted","data":{"object":{"id":"sub_1","customer":"cus_1","ended_at":1e30}}}`,
		`{"id":"evt_10","type":"customer.subscription.updated","data":null}`,
		`{"id":"","type":""}`,
		`{"id":"evt_11","type":"x","id":"evt_12"}`,
		`[]`,
		`{`,
		"\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		sig := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: payload, Secret: secret}).Header
		for _, header := range []string{sig, "t=1,v1=" + string(payload[:min(len(payload), 64)])} {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/webhooks/stripe", bytes.NewReader(payload))
			if err != nil {
				t.Fatal(err)
			}
			req.Header["Stripe-Signature"] = []string{header}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				continue // a header value the HTTP client refuses to send
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode >= 500 {
				t.Fatalf("payload %q: %d %s", payload, res.StatusCode, body)
			}
		}
		for {
			seq, err := proc.ProcessNext(context.Background(), 1<<62)
			if err != nil {
				t.Fatalf("payload %q: stored, but applying it fails and blocks every later event: %v", payload, err)
			}
			if seq == 0 {
				break
			}
		}
	})
}
