package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"time"
)

// ProblemMeterExists is the problem type of a meter whose key, or one of
// whose patterns for its token type, an active meter already has.
const ProblemMeterExists = "https://overage.dev/problems/meter-exists"

// Meter is one meter of the catalog: a Stripe Billing Meter (its event
// name) and the tokens it counts — one token type (input, cache_read,
// cache_write, output, reasoning) of the models its patterns match.
type Meter struct {
	Key        string     `json:"key"`
	EventName  string     `json:"event_name"`
	TokenType  string     `json:"token_type"`
	Models     []string   `json:"models"`
	ArchivedAt *time.Time `json:"archived_at"`
	CreatedAt  time.Time  `json:"created_at"`
}

// MeterParams is a new meter. Models are model_id patterns (an exact id,
// a prefix ending in '*', or '*'); none means every model.
type MeterParams struct {
	Key       string   `json:"key"`
	EventName string   `json:"event_name"`
	TokenType string   `json:"token_type"`
	Models    []string `json:"models,omitempty"`
}

// The meter calls are the operator's: the Client's APIKey must be the
// server's ADMIN_TOKEN. They retry what Record retries (no answer, 5xx,
// 429) with its backoff and bound.

// CreateMeter creates a meter; it routes usage recorded after it. A meter
// of that key, or an active meter of that token type with one of its
// patterns, is an *Error with Type ProblemMeterExists — except when an
// earlier attempt of this call created it and its answer was lost: a
// retry answered 409 finds the meter as asked for in the catalog and
// returns it.
func (c *Client) CreateMeter(ctx context.Context, p MeterParams) (*Meter, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("overage: encode meter: %w", err)
	}
	var m Meter
	attempts, err := c.rest(ctx, http.MethodPost, "/v1/meters", body, &m)
	var apiErr *Error
	if attempts > 1 && errors.As(err, &apiErr) && apiErr.Type == ProblemMeterExists {
		if mine, lerr := c.findMeter(ctx, p); lerr == nil && mine != nil {
			return mine, nil
		}
	}
	if err != nil {
		return nil, err
	}
	return &m, nil
}

// findMeter is the active meter of p's key if it is the meter p asks for.
func (c *Client) findMeter(ctx context.Context, p MeterParams) (*Meter, error) {
	ms, err := c.ListMeters(ctx)
	if err != nil {
		return nil, err
	}
	models := p.Models
	if len(models) == 0 {
		models = []string{"*"}
	}
	for _, m := range ms {
		if m.Key == p.Key && m.EventName == p.EventName && m.TokenType == p.TokenType && m.ArchivedAt == nil && slices.Equal(m.Models, models) {
			return &m, nil
		}
	}
	return nil, nil
}

// ListMeters returns every meter, active and archived, by key; the
// default meters input and output are always among them.
func (c *Client) ListMeters(ctx context.Context) ([]Meter, error) {
	var l struct {
		Meters []Meter `json:"meters"`
	}
	if _, err := c.rest(ctx, http.MethodGet, "/v1/meters", nil, &l); err != nil {
		return nil, err
	}
	return l.Meters, nil
}

// ArchiveMeter stops a meter routing usage recorded after it; archiving an
// archived meter returns it unchanged. The default meters cannot be
// archived (an *Error, 422).
func (c *Client) ArchiveMeter(ctx context.Context, key string) (*Meter, error) {
	if key == "" {
		return nil, errors.New("overage: ArchiveMeter needs the meter's key")
	}
	var m Meter
	if _, err := c.rest(ctx, http.MethodDelete, "/v1/meters/"+url.PathEscape(key), nil, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// rest sends one request that needs no idempotency key (a read, or an
// operator's call that is safe to repeat) until it is answered 2xx
// (decoded into out), refused, the attempts run out or ctx ends, and says
// how many attempts it took. Meters and Usage go through it.
func (c *Client) rest(ctx context.Context, method, path string, body []byte, out any) (int, error) {
	for attempt := 1; ; attempt++ {
		retryAfter, err := c.restAttempt(ctx, method, path, body, out)
		if err == nil {
			return attempt, nil
		}
		var apiErr *Error
		if !errors.As(err, &apiErr) {
			return attempt, err
		}
		apiErr.Attempts = attempt
		if !retryable(apiErr) || attempt >= c.cfg.MaxAttempts {
			return attempt, apiErr
		}
		wait := c.backoff(attempt)
		if retryAfter > 0 {
			wait = retryAfter
		}
		select {
		case <-ctx.Done():
			return attempt, fmt.Errorf("overage: %w (after %d attempts; last: %v)", ctx.Err(), attempt, apiErr)
		case <-time.After(wait):
		}
	}
}

func (c *Client) restAttempt(ctx context.Context, method, path string, body []byte, out any) (time.Duration, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.cfg.BaseURL+path, rd)
	if err != nil {
		return 0, fmt.Errorf("overage: build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.APIKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("overage: %w", ctx.Err())
		}
		return 0, &Error{Err: err}
	}
	defer res.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(res.Body, 16<<20))
	if err != nil {
		return 0, &Error{Err: fmt.Errorf("read response: %w", err)}
	}
	if res.StatusCode >= 200 && res.StatusCode < 300 {
		if err := json.Unmarshal(rb, out); err != nil {
			return 0, &Error{Status: res.StatusCode, Err: fmt.Errorf("decode answer: %w", err)}
		}
		return 0, nil
	}
	return retryAfter(res.Header.Get("Retry-After")), problemOf(res.StatusCode, rb)
}

// problemOf is the *Error of a refusal's problem body.
func problemOf(status int, body []byte) *Error {
	e := &Error{Status: status, Title: http.StatusText(status)}
	var p struct {
		Type   string       `json:"type"`
		Title  string       `json:"title"`
		Detail string       `json:"detail"`
		Errors []FieldError `json:"errors"`
	}
	if json.Unmarshal(body, &p) == nil {
		e.Type, e.Detail, e.Fields = p.Type, p.Detail, p.Errors
		if p.Title != "" {
			e.Title = p.Title
		}
	}
	return e
}
