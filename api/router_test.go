package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/overage-billing/overage/api"
	"github.com/overage-billing/overage/internal/testkit/syncbuf"
)

type pingOK struct{}

func (pingOK) Ping(context.Context) error { return nil }

// echoID answers GET /v1/echo with the request id the handlers see.
type echoID struct{}

func (echoID) Routes(r chi.Router) {
	r.Get("/v1/echo", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(middleware.GetReqID(r.Context())))
	})
}

// TestRequestIDIsBounded: a client X-Request-Id of printable ASCII up to
// api.MaxRequestIDLen is kept; a longer one, or one with a space, a
// control character or a byte outside ASCII, is replaced by a generated id before
// the request is logged, and never reaches the log.
func TestRequestIDIsBounded(t *testing.T) {
	t.Parallel()
	var logs syncbuf.Buffer
	srv := httptest.NewServer(api.NewRouter(api.Config{
		DB: pingOK{}, Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Handlers: []api.Mounter{echoID{}},
	}))
	t.Cleanup(srv.Close)
	kept := strings.Repeat("k", api.MaxRequestIDLen)
	for _, tc := range []struct {
		name, id string
		keep     bool
	}{
		{"longest kept", kept, true},
		{"ordinary", "req-42_abc.DEF", true},
		{"one over the limit", kept + "x", false},
		{"a megabyte", strings.Repeat("m", 1<<20-1024), false},
		{"space", "forged line", false},
		{"tab", "a\tb", false},
		{"not ASCII", "requête", false},
	} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/echo", nil)
		req.Header.Set("X-Request-Id", tc.id)
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var b bytes.Buffer
		_, _ = b.ReadFrom(res.Body)
		res.Body.Close()
		got := b.String()
		switch {
		case tc.keep && got != tc.id:
			t.Errorf("%s: request id %q, want the client's %q", tc.name, got, tc.id)
		case !tc.keep && (got == tc.id || got == "" || len(got) > api.MaxRequestIDLen):
			t.Errorf("%s: request id %.40q…, want a generated one", tc.name, got)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct {
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %v: %.200s", err, line)
		}
		if len(rec.RequestID) == 0 || len(rec.RequestID) > api.MaxRequestIDLen || strings.ContainsAny(rec.RequestID, " \t") {
			t.Errorf("logged request id %.60q", rec.RequestID)
		}
	}
}

// TestNULInQueryIsMalformed: a NUL byte or bytes that are not UTF-8 in a
// query parameter's name or value answer 400 malformed-request naming the
// parameter, before any handler runs.
func TestNULInQueryIsMalformed(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(api.NewRouter(api.Config{DB: pingOK{}, Handlers: []api.Mounter{echoID{}}}))
	t.Cleanup(srv.Close)
	for query, field := range map[string]string{
		"request_id=a%00b": "request_id", "request_id=%00": "request_id", "request_id=%ff%fe": "request_id",
		"cursor=x&limit=1%00": "limit", "na%00me=x": "name",
	} {
		res, err := srv.Client().Get(srv.URL + "/v1/echo?" + query)
		if err != nil {
			t.Fatal(err)
		}
		var p struct {
			Type   string
			Errors []struct{ Field string }
		}
		err = json.NewDecoder(res.Body).Decode(&p)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || err != nil || p.Type != "https://overage.dev/problems/malformed-request" ||
			len(p.Errors) != 1 || p.Errors[0].Field != field {
			t.Errorf("?%s: %d %+v (%v), want 400 malformed-request naming %s", query, res.StatusCode, p, err, field)
		}
	}
	res, err := srv.Client().Get(srv.URL + "/v1/echo?request_id=fine%20text")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("a clean query answered %d", res.StatusCode)
	}
}
