package ingest_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/overage-billing/overage/internal/fastjson"
	"github.com/overage-billing/overage/internal/testkit/apitest"
)

// FuzzCreateUsageEvent sends two bodies under one Idempotency-Key to the
// real API on a real database. No input gets a 5xx; the second is answered
// as the first (a replay) exactly when the two bodies have the same
// canonical form, and otherwise is refused as a reused key.
func FuzzCreateUsageEvent(f *testing.F) {
	s := apitest.Start(f)
	apiKey := s.Tenant(f, "fuzz", 0, 0).APIKey
	ok := `{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2}`
	for _, c := range [][3]string{
		{"k", ok, ` { "output_tokens" : 2.0, "input_tokens":1, "model_id":"\u006d", "user_id":"u"}`},
		{`"k2"`, ok, `{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":3}`},
		{"k3", `{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"output_tokens":3}`, ok},
		{"k4", `{"user_id":"\ud800","model_id":"m","input_tokens":1,"output_tokens":2}`, `{"user_id":"\udc00","model_id":"m","input_tokens":1,"output_tokens":2}`},
		{"k5", "{\"user_id\":\"\xff\",\"model_id\":\"m\",\"input_tokens\":1,\"output_tokens\":2}", ok},
		{"k6", `{"user_id":"\u0000","model_id":"m","input_tokens":1,"output_tokens":2}`, ok},
		{"k7", `{"user_id":"u","model_id":"m","input_tokens":1e400,"output_tokens":-0}`, ok},
		{"k8", `{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"request_id":"r\u2028"}`, `{"request_id":"r` + "\u2028" + `","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2}`},
		{"k9", `{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"timestamp":"0000-01-01T00:00:00Z"}`, ok},
		{"\x7f", `[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`, ok},
	} {
		f.Add(c[0], []byte(c[1]), []byte(c[2]))
	}
	post := func(t *testing.T, key string, body []byte) (int, []byte, bool) {
		req, err := http.NewRequest(http.MethodPost, s.URL+"/v1/usage-events", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header["Idempotency-Key"] = []string{key}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, false // a header value the HTTP client refuses to send
		}
		defer res.Body.Close()
		rb, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode >= 500 {
			t.Fatalf("key %q body %q: %d %s", key, body, res.StatusCode, rb)
		}
		return res.StatusCode, rb, true
	}
	f.Fuzz(func(t *testing.T, key string, a, b []byte) {
		// Each input starts its own key, so earlier inputs never answer.
		// (Invalid UTF-8 is dropped, so the prefix may be shorter than a.)
		prefix := string(bytes.ToValidUTF8(a, nil))
		key = key + "/" + prefix[:min(len(prefix), 40)] + string(rune(len(b)))
		statusA, bodyA, sent := post(t, key, a)
		if !sent {
			return
		}
		statusB, bodyB, sent := post(t, key, b)
		if !sent || statusA >= 300 {
			return
		}
		ca, errA := fastjson.Canonical(a)
		cb, errB := fastjson.Canonical(b)
		if errA != nil {
			t.Fatalf("%q was accepted (%d) but has no canonical form: %v", a, statusA, errA)
		}
		same := errB == nil && bytes.Equal(ca, cb)
		// The body is validated before the key is looked at, so a body the
		// parser refuses (output_tokens 2.0 for 2) is refused as such.
		switch {
		case same && statusB < 300 && (statusB != statusA || !bytes.Equal(bodyA, bodyB)):
			t.Fatalf("%q then %q, one canonical form, answered %d then %d %s", a, b, statusA, statusB, bodyB)
		case same && bytes.Contains(bodyB, []byte("idempotency-key-reused")):
			t.Fatalf("%q then %q, one canonical form, refused as a reused key: %s", a, b, bodyB)
		case !same && statusB < 400:
			t.Fatalf("%q then %q, two canonical forms, both accepted under one key: %d %s", a, b, statusB, bodyB)
		}
	})
}
