package client

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
	if _, err := c.rest(ctx, http.MethodGet, path, nil, u); err != nil {
		return nil, err
	}
	return u, nil
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
