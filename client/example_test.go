package client_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/overage-billing/overage/client"
)

// A scripted overage: the first answer to each request is lost (the server
// recorded the event, the client never heard), as a dropped connection
// does; the retry under the same Idempotency-Key gets the stored answer.
func lossyServer() *httptest.Server {
	var calls atomic.Int32
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			hj, _ := w.(http.Hijacker)
			conn, _, _ := hj.Hijack()
			_ = conn.Close() // the answer is lost
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"id":"0193a1b2-0000-7000-8000-000000000001","request_id":%q,"user_id":"u_42","model_id":"gpt-4o",`+
			`"input_tokens":1200,"output_tokens":350,"overage":{"input_tokens":200,"output_tokens":350},"billing_status":"pending","duplicate":false}`,
			r.Header.Get("Idempotency-Key"))
	}))
}

// Record reports one LLM call. The Idempotency-Key is the request_id,
// minted before the first attempt and resent unchanged, so the lost
// answer's retry is replayed and the call is billed once.
func ExampleClient_Record() {
	srv := lossyServer()
	defer srv.Close()
	c, err := client.New(client.Config{BaseURL: srv.URL, APIKey: "ovg_example", BaseDelay: time.Millisecond})
	if err != nil {
		panic(err)
	}
	res, err := c.Record(context.Background(), client.UsageEvent{
		RequestID: "chatcmpl-123", UserID: "u_42", ModelID: "gpt-4o",
		InputTokens: 1200, OutputTokens: 350, CacheReadInputTokens: 1000,
	}, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(*res.Log.RequestID, res.Replayed, res.Log.Overage.InputTokens, res.Log.BillingStatus)
	// Output: chatcmpl-123 true 200 pending
}
