package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/overage-billing/overage/client"
)

// retryTable is clients/testdata/retry_cases.json, the retry cases every
// client (this one, Python's and TypeScript's) passes against a scripted
// server; its "about" says what each field means.
type retryTable struct {
	Client struct {
		MaxAttempts int `json:"max_attempts"`
		BaseDelayMS int `json:"base_delay_ms"`
		MaxDelayMS  int `json:"max_delay_ms"`
		TimeoutMS   int `json:"timeout_ms"`
	} `json:"client"`
	Inputs        map[string]json.RawMessage `json:"inputs"`
	SuccessBodies map[string]json.RawMessage `json:"success_bodies"`
	Cases         []retryCase                `json:"cases"`
}

type retryCase struct {
	Name           string       `json:"name"`
	Operation      string       `json:"operation"`
	IdempotencyKey string       `json:"idempotency_key"`
	DeadlineMS     int          `json:"deadline_ms"`
	Script         []scriptStep `json:"script"`
	Expect         struct {
		Attempts     int      `json:"attempts"`
		Outcome      string   `json:"outcome"`
		Replayed     bool     `json:"replayed"`
		Key          string   `json:"key"`
		Status       int      `json:"status"`
		Type         string   `json:"type"`
		Fields       []string `json:"fields"`
		MinElapsedMS int      `json:"min_elapsed_ms"`
	} `json:"expect"`
}

type scriptStep struct {
	Drop        bool              `json:"drop"`
	Hang        bool              `json:"hang"`
	Status      int               `json:"status"`
	Headers     map[string]string `json:"headers"`
	ContentType string            `json:"content_type"`
	Body        json.RawMessage   `json:"body"`
}

func loadRetryTable(t *testing.T) *retryTable {
	t.Helper()
	raw, err := os.ReadFile("../clients/testdata/retry_cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var tbl retryTable
	if err := json.Unmarshal(raw, &tbl); err != nil {
		t.Fatalf("retry_cases.json: %v", err)
	}
	if len(tbl.Cases) < 10 {
		t.Fatalf("retry_cases.json has %d cases", len(tbl.Cases))
	}
	return &tbl
}

type seenRequest struct{ key, body, auth string }

// scriptedServer answers each request with the next step of script.
type scriptedServer struct {
	*httptest.Server
	mu      sync.Mutex
	script  []scriptStep
	success json.RawMessage
	seen    []seenRequest
	release chan struct{}
}

func newScriptedServer(t *testing.T, script []scriptStep, success json.RawMessage) *scriptedServer {
	t.Helper()
	s := &scriptedServer{script: slices.Clone(script), success: success, release: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		close(s.release)
		s.Close()
	})
	return s
}

func (s *scriptedServer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.seen = append(s.seen, seenRequest{key: r.Header.Get("Idempotency-Key"), body: string(body), auth: r.Header.Get("Authorization")})
	step := scriptStep{Status: http.StatusInternalServerError, Body: json.RawMessage(`{"type":"script-exhausted"}`)}
	if len(s.script) > 0 {
		step, s.script = s.script[0], s.script[1:]
	}
	s.mu.Unlock()
	switch {
	case step.Drop:
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
		return
	case step.Hang:
		select {
		case <-r.Context().Done():
		case <-s.release:
		}
		return
	}
	out := step.Body
	if out == nil && step.Status/100 == 2 {
		out = s.success
	}
	ct := step.ContentType
	if ct == "" {
		ct = "application/json"
	}
	w.Header().Set("Content-Type", ct)
	for k, v := range step.Headers {
		w.Header().Set(k, v)
	}
	w.WriteHeader(step.Status)
	_, _ = w.Write(out)
}

func (s *scriptedServer) requests() []seenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen)
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// outcome is what one operation returned, whichever it was.
type outcome struct {
	replayed bool
	key      string
	attempts int
}

// runRetryCase runs c and returns what went wrong; transport wraps the
// client's HTTP transport when set (to break the client on purpose).
func runRetryCase(t *testing.T, tbl *retryTable, c retryCase, transport func(http.RoundTripper) http.RoundTripper) []string {
	t.Helper()
	srv := newScriptedServer(t, c.Script, tbl.SuccessBodies[c.Operation])
	var rt http.RoundTripper = http.DefaultTransport.(*http.Transport).Clone()
	if transport != nil {
		rt = transport(rt)
	}
	cl, err := client.New(client.Config{
		BaseURL: srv.URL, APIKey: "ovg_test_key", MaxAttempts: tbl.Client.MaxAttempts,
		BaseDelay:  time.Duration(tbl.Client.BaseDelayMS) * time.Millisecond,
		MaxDelay:   time.Duration(tbl.Client.MaxDelayMS) * time.Millisecond,
		HTTPClient: &http.Client{Timeout: time.Duration(tbl.Client.TimeoutMS) * time.Millisecond, Transport: rt},
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := 60 * time.Second
	if c.DeadlineMS > 0 {
		deadline = time.Duration(c.DeadlineMS) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	in := tbl.Inputs[c.Operation]
	opts := &client.RecordOpts{IdempotencyKey: c.IdempotencyKey}
	var got outcome
	start := time.Now()
	switch c.Operation {
	case "record", "record_no_request_id":
		var ev client.UsageEvent
		mustDecode(t, in, &ev)
		var r *client.Result
		if r, err = cl.Record(ctx, ev, opts); err == nil {
			got = outcome{r.Replayed, r.Key, r.Attempts}
		}
	case "record_batch":
		var evs []client.UsageEvent
		mustDecode(t, in, &evs)
		var r *client.BatchResult
		if r, err = cl.RecordBatch(ctx, evs, opts); err == nil {
			got = outcome{r.Replayed, r.Key, r.Attempts}
		}
	case "checkpoint":
		var ev client.UsageEvent
		mustDecode(t, in, &ev)
		s, serr := cl.Stream(ev.RequestID, ev.UserID, ev.ModelID)
		if serr != nil {
			t.Fatal(serr)
		}
		var r *client.CheckpointResult
		if r, err = s.Checkpoint(ctx, ev.InputTokens, ev.OutputTokens); err == nil {
			got = outcome{r.Replayed, r.Key, r.Attempts}
		}
	case "correct":
		var p struct {
			ID string `json:"usage_log_id"`
			client.CorrectionParams
		}
		mustDecode(t, in, &p)
		var r *client.CorrectionResult
		if r, err = cl.Correct(ctx, p.ID, p.CorrectionParams, opts); err == nil {
			got = outcome{r.Replayed, r.Key, r.Attempts}
		}
	default:
		t.Fatalf("unknown operation %q", c.Operation)
	}
	elapsed := time.Since(start)

	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	exp := c.Expect
	seen := srv.requests()
	if len(seen) != exp.Attempts {
		bad("%d attempts reached the server, want %d", len(seen), exp.Attempts)
	}
	for i, s := range seen {
		if s.key != seen[0].key {
			bad("attempt %d carried Idempotency-Key %q, the first %q", i+1, s.key, seen[0].key)
		}
		if s.body != seen[0].body {
			bad("attempt %d carried another body than the first", i+1)
		}
		if s.auth != "Bearer ovg_test_key" {
			bad("attempt %d carried Authorization %q", i+1, s.auth)
		}
	}
	if len(seen) > 0 {
		if exp.Key == "uuid" {
			if !uuidRE.MatchString(seen[0].key) {
				bad("key %q, want a random UUID", seen[0].key)
			}
		} else if seen[0].key != exp.Key {
			bad("key %q, want %q", seen[0].key, exp.Key)
		}
	}
	if exp.MinElapsedMS > 0 && elapsed < time.Duration(exp.MinElapsedMS)*time.Millisecond {
		bad("took %s, want at least %dms (Retry-After not honoured)", elapsed, exp.MinElapsedMS)
	}
	var apiErr *client.Error
	switch exp.Outcome {
	case "ok":
		switch {
		case err != nil:
			bad("failed: %v", err)
		case got.attempts != exp.Attempts || got.replayed != exp.Replayed:
			bad("result attempts %d replayed %v, want %d and %v", got.attempts, got.replayed, exp.Attempts, exp.Replayed)
		case len(seen) > 0 && got.key != seen[0].key:
			bad("result key %q, sent %q", got.key, seen[0].key)
		}
	case "deadline":
		if !errors.Is(err, context.DeadlineExceeded) {
			bad("err = %v, want the deadline", err)
		}
	case "error":
		if !errors.As(err, &apiErr) {
			bad("err = %v, want a *client.Error", err)
			break
		}
		var fields []string
		for _, f := range apiErr.Fields {
			fields = append(fields, f.Field)
		}
		if apiErr.Status != exp.Status || apiErr.Type != exp.Type || !slices.Equal(fields, exp.Fields) || apiErr.Attempts != exp.Attempts {
			bad("error status %d type %q fields %v attempts %d, want %d %q %v %d", apiErr.Status, apiErr.Type, fields, apiErr.Attempts,
				exp.Status, exp.Type, exp.Fields, exp.Attempts)
		}
		if exp.Status == 0 && apiErr.Err == nil {
			bad("error %v, want a transport error", apiErr)
		}
	default:
		t.Fatalf("unknown outcome %q", exp.Outcome)
	}
	return problems
}

func mustDecode(t *testing.T, raw json.RawMessage, v any) {
	t.Helper()
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatal(err)
	}
}

func TestSharedRetryCases(t *testing.T) {
	t.Parallel()
	tbl := loadRetryTable(t)
	for _, c := range tbl.Cases {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			for _, p := range runRetryCase(t, tbl, c, nil) {
				t.Error(p)
			}
		})
	}
}

// keyPerAttempt is the double-billing bug: a fresh Idempotency-Key minted
// for every attempt.
type keyPerAttempt struct {
	next http.RoundTripper
	mu   sync.Mutex
	n    int
}

func (k *keyPerAttempt) RoundTrip(r *http.Request) (*http.Response, error) {
	k.mu.Lock()
	k.n++
	n := k.n
	k.mu.Unlock()
	r = r.Clone(r.Context())
	r.Header.Set("Idempotency-Key", fmt.Sprintf("attempt-%d", n))
	return k.next.RoundTrip(r)
}

// The table catches a client that mints its key inside the retry loop.
func TestSharedRetryCasesCatchAKeyMintedPerAttempt(t *testing.T) {
	t.Parallel()
	tbl := loadRetryTable(t)
	var failed []string
	for _, c := range tbl.Cases {
		if c.Expect.MinElapsedMS > 0 {
			continue // slow, and caught by the others
		}
		if len(runRetryCase(t, tbl, c, func(rt http.RoundTripper) http.RoundTripper { return &keyPerAttempt{next: rt} })) > 0 {
			failed = append(failed, c.Name)
		}
	}
	for _, want := range []string{"lost answer is resent under the same key and replayed", "a timed-out attempt is resent under the same key",
		"batch: lost answer replayed under the batch's minted key"} {
		if !slices.Contains(failed, want) {
			t.Errorf("case %q passed with a key minted per attempt (failed: %v)", want, failed)
		}
	}
}
