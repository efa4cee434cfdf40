// Package httpx writes JSON and RFC 9457 problem responses, and maps
// application error codes to HTTP statuses in its one table.
package httpx

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/overage-billing/overage"
)

// ProblemTypeBase prefixes every problem type slug. The URIs are stable
// identifiers that clients branch on; they are documented in
// api/openapi.yaml.
const ProblemTypeBase = "https://overage.dev/problems/"

// statuses is the one table from error code to HTTP status.
var statuses = map[overage.ErrorCode]int{
	overage.EMALFORMED:    http.StatusBadRequest,
	overage.EINVALID:      http.StatusUnprocessableEntity,
	overage.EUNAUTHORIZED: http.StatusUnauthorized,
	overage.EFORBIDDEN:    http.StatusForbidden,
	overage.ENOTFOUND:     http.StatusNotFound,
	overage.EMETHOD:       http.StatusMethodNotAllowed,
	overage.ECONFLICT:     http.StatusConflict,
	overage.ETOOLARGE:     http.StatusRequestEntityTooLarge,
	overage.EBUSY:         http.StatusTooManyRequests,
	overage.EUNAVAILABLE:  http.StatusServiceUnavailable,
	overage.EINTERNAL:     http.StatusInternalServerError,
}

// StatusOf returns the HTTP status of an application error code.
func StatusOf(code overage.ErrorCode) int {
	if s, ok := statuses[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Problem is an RFC 9457 problem details object.
type Problem struct {
	Type   string               `json:"type"`
	Title  string               `json:"title"`
	Status int                  `json:"status"`
	Detail string               `json:"detail,omitempty"`
	Errors []overage.FieldError `json:"errors,omitempty"`
}

// ProblemOf renders err as a problem. Internal errors reveal nothing.
func ProblemOf(err error) (Problem, *overage.Error) {
	e := overage.AsError(err)
	status := StatusOf(e.Code)
	return Problem{
		Type:   ProblemTypeBase + e.Type,
		Title:  http.StatusText(status),
		Status: status,
		Detail: e.Message,
		Errors: e.Fields,
	}, e
}

// ProblemBody renders err as the status and bytes of a problem response.
func ProblemBody(err error) (int, []byte) {
	p, _ := ProblemOf(err)
	b, _ := json.Marshal(p)
	return p.Status, b
}

// Error writes err as a problem response. Internal errors are logged with
// their cause; users see "internal error".
func Error(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	p, e := ProblemOf(err)
	if e.Code == overage.EINTERNAL || e.Code == overage.EUNAVAILABLE {
		logger.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "status", p.Status, "err", err)
	}
	if e.Code == overage.EUNAUTHORIZED && w.Header().Get("WWW-Authenticate") == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="overage"`)
	}
	if e.RetryAfter > 0 {
		secs := int(e.RetryAfter.Seconds())
		if secs < 1 {
			secs = 1
		}
		w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	b, _ := json.Marshal(p)
	Write(w, "application/problem+json", p.Status, b)
}

// JSON writes v as a JSON response.
func JSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = ProblemBody(err)
		Write(w, "application/problem+json", status, b)
		return
	}
	Write(w, "application/json", status, b)
}

// Write writes a response with a body already rendered.
func Write(w http.ResponseWriter, contentType string, status int, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// Bearer returns the bearer token of a request.
func Bearer(r *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// IsAdmin reports whether r carries adminToken as its bearer token. Both
// sides are hashed first, so the comparison takes the same time whatever
// the token's length or content. An empty adminToken admits no one.
func IsAdmin(r *http.Request, adminToken string) bool {
	tok, ok := Bearer(r)
	return ok && sameToken(tok, adminToken)
}

func sameToken(tok, adminToken string) bool {
	if adminToken == "" {
		return false
	}
	got, want := sha256.Sum256([]byte(tok)), sha256.Sum256([]byte(adminToken))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// AdminOnly refuses, with 401, every request without the admin token: the
// finance and operator endpoints.
func AdminOnly(adminToken string, logger *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !IsAdmin(r, adminToken) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="overage-admin"`)
				refuseAdmin(w, r, logger, adminToken, "send the admin token (ADMIN_TOKEN) as Authorization: Bearer <token>")
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

func refuseAdmin(w http.ResponseWriter, r *http.Request, logger *slog.Logger, adminToken, msg string) {
	if adminToken == "" {
		msg = "ADMIN_TOKEN is not configured: finance and operator endpoints are disabled"
	}
	Error(w, r, logger, overage.Errorf(overage.EUNAUTHORIZED, "unauthorized", "%s", msg))
}

// DecodeJSON reads one JSON object of at most maxBytes from r's body into
// v, refusing unknown fields — a typo in a field name must not pass as
// "leave it unchanged" — and a second value after the first.
func DecodeJSON(r *http.Request, v any, maxBytes int64) error {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return overage.Errorf(overage.ETOOLARGE, "payload-too-large", "the body is over %d bytes", maxBytes)
		}
		return overage.Errorf(overage.EMALFORMED, "malformed-request", "could not read the body")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		e := overage.Errorf(overage.EMALFORMED, "malformed-request", "the body is not the expected JSON object: %v", err)
		e.Fields = []overage.FieldError{{Field: "body", Detail: err.Error()}}
		return e
	}
	if dec.More() {
		e := overage.Errorf(overage.EMALFORMED, "malformed-request", "the body holds more than one JSON value")
		e.Fields = []overage.FieldError{{Field: "body", Detail: "more than one JSON value"}}
		return e
	}
	return nil
}
