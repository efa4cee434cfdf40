// Package client is the Go client app servers use to report LLM usage to
// overage — the client half of the idempotency contract.
//
// One logical operation (one LLM call's usage) gets one Idempotency-Key,
// fixed before the first attempt and sent unchanged, with the same body
// bytes, on every retry: the caller's key, else the event's request_id,
// else a random UUID. A retry after a lost response is then answered with
// the stored outcome, never recorded twice.
//
// Retried: transport errors, 5xx, 429 and 409 "in progress" — with
// exponential backoff, full jitter, and the server's Retry-After when it
// gives one. Never retried: 409 "key reused" (a bug in the caller: a new
// event needs a new key) and every other 4xx. Attempts are bounded and the
// context is honoured while waiting.
package client

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Problem types the client branches on.
const (
	ProblemKeyReused  = "https://overage.dev/problems/idempotency-key-reused"
	ProblemInProgress = "https://overage.dev/problems/idempotency-key-in-progress"
)

// Config configures a Client.
type Config struct {
	// BaseURL of the overage API, e.g. http://127.0.0.1:8080.
	BaseURL string
	// APIKey is the tenant's API key.
	APIKey string
	// HTTPClient, default one with a 10 s timeout per attempt.
	HTTPClient *http.Client
	// MaxAttempts bounds the attempts per event, default 8.
	MaxAttempts int
	// BaseDelay and MaxDelay shape the backoff (defaults 100 ms and 10 s):
	// before retry n the client sleeps a random time in
	// [0, min(MaxDelay, BaseDelay*2^n)), or the server's Retry-After.
	BaseDelay, MaxDelay time.Duration
}

// Client reports usage events. It is safe for concurrent use.
type Client struct {
	cfg Config
}

// New returns a Client.
func New(cfg Config) (*Client, error) {
	if cfg.BaseURL == "" {
		return nil, errors.New("client: BaseURL is required")
	}
	if cfg.APIKey == "" {
		return nil, errors.New("client: APIKey is required")
	}
	cfg.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 8
	}
	if cfg.BaseDelay <= 0 {
		cfg.BaseDelay = 100 * time.Millisecond
	}
	if cfg.MaxDelay <= 0 {
		cfg.MaxDelay = 10 * time.Second
	}
	return &Client{cfg: cfg}, nil
}

// UsageEvent is one LLM call's usage.
type UsageEvent struct {
	// RequestID is the business key of the call (the LLM's request id),
	// unique per tenant; optional but recommended.
	RequestID string `json:"request_id,omitempty"`
	// Timestamp of the usage; the client sets it to now before the first
	// attempt when zero, so a retry reports the same instant.
	Timestamp    time.Time `json:"timestamp"`
	UserID       string    `json:"user_id"`
	ModelID      string    `json:"model_id"`
	InputTokens  int64     `json:"input_tokens"`
	OutputTokens int64     `json:"output_tokens"`
	// Optional parts of the totals, included in them (not added): cached
	// input read and written, and reasoning output. Zero is not sent.
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens,omitempty"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens,omitempty"`
	ReasoningOutputTokens    int64 `json:"reasoning_output_tokens,omitempty"`
}

// Overage is the billable part of a usage log.
type Overage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// UsageLog is the server's record of an event.
type UsageLog struct {
	ID            string     `json:"id"`
	TenantID      string     `json:"tenant_id"`
	RequestID     *string    `json:"request_id"`
	Timestamp     time.Time  `json:"timestamp"`
	UserID        string     `json:"user_id"`
	ModelID       string     `json:"model_id"`
	InputTokens   int64      `json:"input_tokens"`
	OutputTokens  int64      `json:"output_tokens"`
	Overage       Overage    `json:"overage"`
	BillingStatus string     `json:"billing_status"`
	BilledAt      *time.Time `json:"billed_at"`
	CreatedAt     time.Time  `json:"created_at"`
	Duplicate     bool       `json:"duplicate"`
}

// Result is the outcome of Record.
type Result struct {
	Log UsageLog
	// Replayed: the server answered with the stored outcome of an earlier
	// attempt under the same key (the first answer was lost, say).
	Replayed bool
	// Duplicate: the request_id was already recorded under another key;
	// nothing new was recorded or billed.
	Duplicate bool
	// Key is the Idempotency-Key used; Attempts how many requests it took.
	Key      string
	Attempts int
}

// Error is a refusal the client will not retry, or the last error after
// the attempts ran out.
type Error struct {
	Status   int
	Type     string
	Title    string
	Detail   string
	Fields   []FieldError
	Attempts int
	// Err is a transport error, when there was no answer.
	Err error
}

// FieldError names one bad input.
type FieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("overage: no answer after %d attempts: %v", e.Attempts, e.Err)
	}
	return fmt.Sprintf("overage: %d %s: %s (%s)", e.Status, e.Title, e.Detail, e.Type)
}

func (e *Error) Unwrap() error { return e.Err }

// RecordOpts are optional inputs of Record.
type RecordOpts struct {
	// IdempotencyKey names this operation; default ev.RequestID, else a
	// random UUID minted once, before the first attempt.
	IdempotencyKey string
}

// Record sends ev, retrying safely until it is recorded, refused, the
// attempts run out or ctx ends.
func (c *Client) Record(ctx context.Context, ev UsageEvent, opts *RecordOpts) (*Result, error) {
	key := ""
	if opts != nil {
		key = opts.IdempotencyKey
	}
	if key == "" {
		key = ev.RequestID
	}
	if key == "" {
		key = newUUID()
	}
	if ev.Timestamp.IsZero() {
		ev.Timestamp = time.Now().UTC()
	}
	// The body is fixed before the first attempt: every retry must be the
	// same request, byte for byte, or the server would see key reuse.
	body, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("overage: encode event: %w", err)
	}

	res := &Result{}
	attempts, replayed, err := c.send(ctx, "/v1/usage-events", key, body, func(rb []byte) error {
		return json.Unmarshal(rb, &res.Log)
	})
	if err != nil {
		return nil, err
	}
	res.Duplicate = res.Log.Duplicate
	res.Replayed, res.Key, res.Attempts = replayed, key, attempts
	return res, nil
}

// BatchEvent is one event's answer in a batch: its usage log, new or — when
// Duplicate is set — the one an earlier request recorded with its
// request_id. Index is its position in the batch sent.
type BatchEvent struct {
	Index int `json:"index"`
	UsageLog
}

// BatchResult is the outcome of RecordBatch.
type BatchResult struct {
	// Events in the order sent.
	Events []BatchEvent `json:"events"`
	// Created events were recorded by this batch; Duplicates were already
	// recorded by an earlier request (nothing new is billed for them).
	Created    int `json:"created"`
	Duplicates int `json:"duplicates"`
	// Replayed: the server answered with the stored outcome of an earlier
	// attempt under the same key.
	Replayed bool `json:"-"`
	// Key is the Idempotency-Key used; Attempts how many requests it took.
	Key      string `json:"-"`
	Attempts int    `json:"-"`
}

// MaxBatchEvents is the most events one RecordBatch call may send.
const MaxBatchEvents = 1000

// RecordBatch sends up to MaxBatchEvents events in one request, recorded in
// one transaction, with the retries of Record: one key for the batch (the
// caller's, else a random UUID minted before the first attempt), the same
// body on every attempt. Every event needs a RequestID, unique in the
// batch: it is what makes a batch split or regrouped under a new key —
// after the attempts ran out, say — safe to send again, since the server
// answers an already recorded request_id with its log and bills nothing
// twice.
func (c *Client) RecordBatch(ctx context.Context, events []UsageEvent, opts *RecordOpts) (*BatchResult, error) {
	if len(events) == 0 || len(events) > MaxBatchEvents {
		return nil, fmt.Errorf("overage: a batch holds 1 to %d events, got %d", MaxBatchEvents, len(events))
	}
	key := ""
	if opts != nil {
		key = opts.IdempotencyKey
	}
	if key == "" {
		key = newUUID()
	}
	batch := struct {
		Events []UsageEvent `json:"events"`
	}{Events: make([]UsageEvent, len(events))}
	now := time.Now().UTC()
	for i, ev := range events {
		if ev.RequestID == "" {
			return nil, fmt.Errorf("overage: batch event %d has no RequestID; every batched event needs one", i)
		}
		if ev.Timestamp.IsZero() {
			ev.Timestamp = now
		}
		batch.Events[i] = ev
	}
	body, err := json.Marshal(batch)
	if err != nil {
		return nil, fmt.Errorf("overage: encode batch: %w", err)
	}
	res := &BatchResult{}
	attempts, replayed, err := c.send(ctx, "/v1/usage-events/batch", key, body, func(rb []byte) error {
		return json.Unmarshal(rb, res)
	})
	if err != nil {
		return nil, err
	}
	res.Replayed, res.Key, res.Attempts = replayed, key, attempts
	return res, nil
}

// send posts body under key to path until it is answered 200 or 202
// (decoded by decode), refused, the attempts run out or ctx ends.
func (c *Client) send(ctx context.Context, path, key string, body []byte, decode func([]byte) error) (int, bool, error) {
	var last *Error
	for attempt := 1; ; attempt++ {
		replayed, retryAfter, err := c.attempt(ctx, path, key, body, decode)
		if err == nil {
			return attempt, replayed, nil
		}
		var apiErr *Error
		if !errors.As(err, &apiErr) {
			return 0, false, err
		}
		apiErr.Attempts = attempt
		last = apiErr
		if !retryable(apiErr) || attempt >= c.cfg.MaxAttempts {
			return 0, false, last
		}
		wait := c.backoff(attempt)
		if retryAfter > 0 {
			wait = retryAfter
		}
		select {
		case <-ctx.Done():
			return 0, false, fmt.Errorf("overage: %w (after %d attempts; last: %v)", ctx.Err(), attempt, last)
		case <-time.After(wait):
		}
	}
}

func (c *Client) attempt(ctx context.Context, path, key string, body []byte, decode func([]byte) error) (bool, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.cfg.BaseURL+path, bytes.NewReader(body))
	if err != nil {
		return false, 0, fmt.Errorf("overage: build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.APIKey)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return false, 0, fmt.Errorf("overage: %w", ctx.Err())
		}
		return false, 0, &Error{Err: err}
	}
	defer res.Body.Close()
	// A batch answer of 1,000 logs is about 600 KB.
	rb, err := io.ReadAll(io.LimitReader(res.Body, 16<<20))
	if err != nil {
		return false, 0, &Error{Err: fmt.Errorf("read response: %w", err)}
	}
	if res.StatusCode == http.StatusOK || res.StatusCode == http.StatusAccepted {
		if err := decode(rb); err != nil {
			return false, 0, &Error{Status: res.StatusCode, Err: fmt.Errorf("decode answer: %w", err)}
		}
		return res.Header.Get("Idempotent-Replayed") == "true", 0, nil
	}
	return false, retryAfter(res.Header.Get("Retry-After")), problemOf(res.StatusCode, rb)
}

// retryable says whether the same request may succeed later.
func retryable(e *Error) bool {
	switch {
	case e.Err != nil && e.Status == 0: // no answer: the request may or may not have run; the key makes a retry safe
		return true
	case e.Status == http.StatusConflict:
		return e.Type == ProblemInProgress
	case e.Status == http.StatusTooManyRequests, e.Status >= 500:
		return true
	}
	return false
}

func (c *Client) backoff(attempt int) time.Duration {
	d := c.cfg.MaxDelay
	if shift := attempt - 1; shift < 30 {
		d = min(d, c.cfg.BaseDelay<<shift)
	}
	return rand.N(d + 1)
}

// retryAfter parses Retry-After as seconds or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
