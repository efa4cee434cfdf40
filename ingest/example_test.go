package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/ingest"
)

// oneKey is an Authenticator that knows one tenant API key.
type oneKey struct{}

func (oneKey) Authenticate(_ context.Context, apiKey string) (overage.Principal, error) {
	if apiKey != "ovg_example" {
		return overage.Principal{}, overage.Errorf(overage.EUNAUTHORIZED, "unauthorized", "unknown API key")
	}
	return overage.Principal{TenantID: uuid.MustParse("0193a1b2-0000-7000-8000-00000000000a")}, nil
}

// The contract checks a request in a fixed order — the API key, the
// Idempotency-Key, the body — and refuses it with a problem document
// before anything is stored, so these answers need no database.
func ExampleHandler() {
	r := chi.NewRouter()
	ingest.NewHandler(ingest.HandlerConfig{Auth: oneKey{}}).Routes(r)
	srv := httptest.NewServer(r)
	defer srv.Close()

	post := func(apiKey, key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/usage-events", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer res.Body.Close()
		var problem struct {
			Type   string `json:"type"`
			Errors []struct {
				Field string `json:"field"`
			} `json:"errors"`
		}
		if err := json.NewDecoder(res.Body).Decode(&problem); err != nil {
			panic(err)
		}
		fmt.Println(res.StatusCode, res.Header.Get("Content-Type"), strings.TrimPrefix(problem.Type, "https://overage.dev/problems/"), problem.Errors)
	}
	event := `{"request_id":"chatcmpl-123","user_id":"u_42","model_id":"gpt-4o","input_tokens":1200,"output_tokens":350}`
	post("ovg_unknown", "chatcmpl-123", event)
	post("ovg_example", "", event)
	post("ovg_example", "chatcmpl-123", `{"user_id":"u_42","model_id":"gpt-4o","input_tokens":-1,"output_tokens":350}`)
	// Output:
	// 401 application/problem+json unauthorized []
	// 400 application/problem+json idempotency-key-invalid [{Idempotency-Key}]
	// 422 application/problem+json validation-failed [{input_tokens}]
}
