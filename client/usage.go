package client

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// MeterUsage is one meter's allowance period so far.
type MeterUsage struct {
	Meter     string `json:"meter"`
	EventName string `json:"event_name"`
	Included  int64  `json:"included"`
	Used      int64  `json:"used"`
	Remaining int64  `json:"remaining"`
	Overage   int64  `json:"overage"`
	Billed    int64  `json:"billed"`
	Pending   int64  `json:"pending"`
}

// Usage is the answer of GET /v1/usage.
type Usage struct {
	TenantID string `json:"tenant_id"`
	Period   struct {
		Start time.Time `json:"start"`
		End   time.Time `json:"end"`
	} `json:"period"`
	Meters []MeterUsage `json:"meters"`
}

// Meter returns the usage of the meter with key k, or nil.
func (u *Usage) Meter(k string) *MeterUsage {
	for i := range u.Meters {
		if u.Meters[i].Meter == k {
			return &u.Meters[i]
		}
	}
	return nil
}

// UsageOpts are optional inputs of Usage.
type UsageOpts struct {
	// PeriodStart selects an earlier allowance period; zero: the current.
	PeriodStart time.Time
}

// Usage reads the tenant's usage of its allowance period so far, per
// meter: included, used, remaining, overage, billed and pending tokens.
// Transport errors, 5xx and 429 are retried as Record retries.
func (c *Client) Usage(ctx context.Context, opts *UsageOpts) (*Usage, error) {
	path := "/v1/usage"
	if opts != nil && !opts.PeriodStart.IsZero() {
		path += "?period_start=" + url.QueryEscape(opts.PeriodStart.UTC().Format(time.RFC3339Nano))
	}
	u := &Usage{}
	if err := c.get(ctx, path, u); err != nil {
		return nil, err
	}
	return u, nil
}

// get reads path into v, retrying what may succeed later.
func (c *Client) get(ctx context.Context, path string, v any) error {
	for attempt := 1; ; attempt++ {
		retryAfter, err := c.getOnce(ctx, path, v)
		if err == nil {
			return nil
		}
		var apiErr *Error
		if !errors.As(err, &apiErr) {
			return err
		}
		apiErr.Attempts = attempt
		if !retryable(apiErr) || attempt >= c.cfg.MaxAttempts {
			return apiErr
		}
		wait := c.backoff(attempt)
		if retryAfter > 0 {
			wait = retryAfter
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("overage: %w (after %d attempts; last: %v)", ctx.Err(), attempt, apiErr)
		case <-time.After(wait):
		}
	}
}

func (c *Client) getOnce(ctx context.Context, path string, v any) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.cfg.BaseURL+path, nil)
	if err != nil {
		return 0, fmt.Errorf("overage: build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.APIKey)
	res, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("overage: %w", ctx.Err())
		}
		return 0, &Error{Err: err}
	}
	defer res.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	if err != nil {
		return 0, &Error{Err: fmt.Errorf("read response: %w", err)}
	}
	if res.StatusCode == http.StatusOK {
		if err := json.Unmarshal(rb, v); err != nil {
			return 0, &Error{Status: res.StatusCode, Err: fmt.Errorf("decode answer: %w", err)}
		}
		return 0, nil
	}
	e := &Error{Status: res.StatusCode, Title: http.StatusText(res.StatusCode)}
	var p struct {
		Type   string       `json:"type"`
		Title  string       `json:"title"`
		Detail string       `json:"detail"`
		Errors []FieldError `json:"errors"`
	}
	if json.Unmarshal(rb, &p) == nil {
		e.Type, e.Detail, e.Fields = p.Type, p.Detail, p.Errors
		if p.Title != "" {
			e.Title = p.Title
		}
	}
	return retryAfter(res.Header.Get("Retry-After")), e
}

// ErrInvalidSignature is VerifyWebhook's answer to a delivery that the
// secret did not sign, whose body was changed, or that is older (or
// further ahead) than the tolerance.
var ErrInvalidSignature = errors.New("overage: invalid Overage-Signature")

// VerifyWebhook checks an alert delivery: header is its Overage-Signature
// ("t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">"), body the raw
// request body as received (not re-encoded), secret the whsec_... shown
// when the endpoint was set. A tolerance above zero also refuses a
// signature time further than it from now (5 minutes is a good value: it
// bounds replays of a captured delivery). Deduplicate verified deliveries
// on their Overage-Event-Id: a retry carries the same id.
func VerifyWebhook(secret, header string, body []byte, tolerance time.Duration) error {
	var ts string
	var sigs []string
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 || secret == "" {
		return ErrInvalidSignature
	}
	if tolerance > 0 {
		if d := time.Since(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
			return ErrInvalidSignature
		}
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + "."))
	m.Write(body)
	want := hex.EncodeToString(m.Sum(nil))
	for _, s := range sigs {
		if hmac.Equal([]byte(s), []byte(want)) {
			return nil
		}
	}
	return ErrInvalidSignature
}
