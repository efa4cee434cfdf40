package emulator

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// apiError is a Stripe error body's "error" object.
type apiError struct {
	status  int
	Type    string `json:"type"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
	outcome string
}

func (a *apiError) body() []byte {
	b, err := json.Marshal(struct {
		Error *apiError `json:"error"`
	}{a})
	if err != nil {
		panic(fmt.Sprintf("emulator: encoding an error body: %v", err))
	}
	return b
}

func invalidRequest(code, param, format string, args ...any) *apiError {
	return &apiError{
		status:  http.StatusBadRequest,
		Type:    "invalid_request_error",
		Code:    code,
		Param:   param,
		Message: fmt.Sprintf(format, args...),
		outcome: OutcomeInvalid,
	}
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("emulator: encoding a response: %v", err))
	}
	return b
}

// dropConnection closes the client's connection without an answer, so the
// client sees a network error — the "lost response".
func dropConnection(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	// Not hijackable (HTTP/2, a recorder): make net/http abort the response.
	panic(http.ErrAbortHandler)
}

// maskKey shows an API key the way Stripe's 401 message does.
func maskKey(key string) string {
	if len(key) <= 12 {
		return strings.Repeat("*", len(key))
	}
	prefix := key[:strings.LastIndex(key[:8], "_")+1]
	return prefix + strings.Repeat("*", len(key)-len(prefix)-4) + key[len(key)-4:]
}

// serveHTTP sets the headers every answer carries, authenticates and routes.
func (e *Emulator) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/_emulator/") {
		e.serveControl(w, r)
		return
	}

	// The form is read before the request is recorded so that a recorded
	// request always carries its identifier: an observer polling Requests()
	// never sees the key without it.
	var form url.Values
	var perr *apiError
	if r.Method == http.MethodPost {
		form, perr = parseForm(w, r)
	}
	requestID := e.newRequestID()
	rec := e.record(r, requestID, form)
	w.Header().Set("Request-Id", requestID)
	w.Header().Set("Stripe-Version", "2024-06-20")
	if k := r.Header.Get("Idempotency-Key"); k != "" && r.Method == http.MethodPost {
		w.Header().Set("Idempotency-Key", k)
	}

	account, aerr := e.authenticate(r)
	if aerr != nil {
		e.finish(rec, aerr.status, OutcomeUnauthorized)
		writeJSON(w, aerr.status, aerr.body())
		return
	}

	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case r.Method == http.MethodPost && path == "/v1/billing/meter_events":
		e.handleMeterEvent(w, r, rec, account, form, perr)
	case r.Method == http.MethodPost && path == "/v1/customers":
		e.handleCreateCustomer(w, rec, form, perr)
	case r.Method == http.MethodGet && strings.HasPrefix(path, "/v1/customers/") && !strings.Contains(strings.TrimPrefix(path, "/v1/customers/"), "/"):
		e.handleGetCustomer(w, r, rec, strings.TrimPrefix(path, "/v1/customers/"))
	case r.Method == http.MethodGet && path == "/v1/billing/meters":
		e.handleListMeters(w, r, rec)
	case r.Method == http.MethodGet && strings.HasPrefix(path, "/v1/billing/meters/"):
		rest := strings.Split(strings.TrimPrefix(path, "/v1/billing/meters/"), "/")
		switch {
		case len(rest) == 1 && rest[0] != "":
			e.handleGetMeter(w, r, rec, rest[0])
		case len(rest) == 2 && rest[0] != "" && rest[1] == "event_summaries":
			e.handleEventSummaries(w, r, rec, rest[0])
		default:
			e.notFound(w, r, rec)
		}
	default:
		e.notFound(w, r, rec)
	}
}

func (e *Emulator) notFound(w http.ResponseWriter, r *http.Request, rec *Request) {
	a := &apiError{
		status:  http.StatusNotFound,
		Type:    "invalid_request_error",
		Message: fmt.Sprintf("Unrecognized request URL (%s: %s). The stripe emulator implements only billing meter events, meters and customers.", r.Method, r.URL.Path),
	}
	e.finish(rec, a.status, OutcomeNotFound)
	writeJSON(w, a.status, a.body())
}

// authenticate returns the account (the API key) of a request.
func (e *Emulator) authenticate(r *http.Request) (string, *apiError) {
	auth := r.Header.Get("Authorization")
	key, ok := strings.CutPrefix(auth, "Bearer ")
	key = strings.TrimSpace(key)
	if auth == "" || !ok || key == "" {
		return "", &apiError{
			status:  http.StatusUnauthorized,
			Type:    "invalid_request_error",
			Message: "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').",
		}
	}
	valid := strings.HasPrefix(key, "sk_") || strings.HasPrefix(key, "rk_")
	if e.apiKeys != nil {
		valid = e.apiKeys[key]
	}
	if !valid {
		return "", &apiError{
			status:  http.StatusUnauthorized,
			Type:    "invalid_request_error",
			Message: "Invalid API Key provided: " + maskKey(key),
		}
	}
	return key, nil
}
