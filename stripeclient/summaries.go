package stripeclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meter"
	"github.com/stripe/stripe-go/v79/billing/metereventsummary"
	"golang.org/x/time/rate"
)

// Defaults of a SummaryClient.
const (
	// DefaultReadRateLimit is the calls/s a SummaryClient makes when
	// Config.RateLimit is zero: below Stripe's 25 read calls/s in test
	// mode (100 in live mode), so a reconciliation never starves the
	// workers of the account's budget. Each page of a list is one call.
	DefaultReadRateLimit = 20.0
	// DefaultSummaryPageSize is the page size of list calls, Stripe's
	// maximum.
	DefaultSummaryPageSize = 100
	// summaryAttempts bounds the tries of one listing on a retryable error
	// (network, 409, 429, 5xx); a read has no side effect, so trying the
	// whole listing again is always safe.
	summaryAttempts = 3
)

// Meter is a Stripe Billing Meter, as reconciliation needs it.
type Meter struct {
	ID        string `json:"id"`
	EventName string `json:"event_name"`
	// Status is "active" or "inactive". An inactive meter keeps the
	// summaries of the events it received while active.
	Status string `json:"status"`
	// Formula is the meter's default aggregation ("sum", "count", ...).
	// Summaries are only comparable with billed overage when it is "sum".
	Formula string `json:"formula"`
	// CustomerPayloadKey and ValuePayloadKey are the payload keys the
	// meter reads the customer and the value from.
	CustomerPayloadKey string `json:"customer_payload_key"`
	ValuePayloadKey    string `json:"value_payload_key"`
}

// EventSummary is one window of a meter's aggregated usage for one
// customer, as Stripe reports it: [Start, End), in UTC.
type EventSummary struct {
	Start time.Time
	End   time.Time
	// Value is Stripe's aggregated_value (a float in Stripe's API; a sum of
	// integer values is integral).
	Value float64
}

// SummaryReader reads what Stripe holds for meters: the meters of the
// account and their per-day event summaries. *SummaryClient implements it
// with stripe-go; reconciliation depends only on this interface.
type SummaryReader interface {
	// Meters lists every meter of the account, active or not, following
	// every page.
	Meters(ctx context.Context) ([]Meter, error)
	// DailySummaries lists customer's usage on meter meterID per UTC day
	// over [start, end), following every page. start and end must be
	// midnights UTC (Stripe refuses windows not aligned to the grouping)
	// with start before end.
	DailySummaries(ctx context.Context, meterID, customer string, start, end time.Time) ([]EventSummary, error)
}

// SummaryClient reads meters and event summaries through stripe-go. It is
// safe for concurrent use.
type SummaryClient struct {
	meters    meter.Client
	summaries metereventsummary.Client
	secretKey string
	apiBase   string
	pageSize  int64
	log       *slog.Logger
}

var _ SummaryReader = (*SummaryClient)(nil)

// NewSummaryReader validates cfg exactly as New does and builds a
// SummaryClient on its own stripe-go backend (no globals). Config.RateLimit
// and Burst limit this client's calls (default DefaultReadRateLimit, one
// call per page); MaxNetworkRetries is stripe-go's own retry count (default
// 0): a retryable failure makes the client list again from the start, up to
// three times, with a backoff that honours the context.
func NewSummaryReader(cfg Config) (*SummaryClient, error) {
	if cfg.RateLimit == 0 {
		cfg.RateLimit = DefaultReadRateLimit
	}
	// New's validation is the one place the rules of a Config live.
	if _, err := New(cfg); err != nil {
		return nil, err
	}
	if cfg.APIBase == "" {
		cfg.APIBase = DefaultAPIBase
	}
	if cfg.Burst == 0 {
		cfg.Burst = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	httpClient := observingClient(cfg.HTTPClient)
	httpClient.Transport = summaryLimitedTransport{
		base:    httpClient.Transport,
		limiter: rate.NewLimiter(rate.Limit(cfg.RateLimit), cfg.Burst),
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(cfg.APIBase),
		MaxNetworkRetries: stripe.Int64(cfg.MaxNetworkRetries),
		LeveledLogger:     slogLeveled{log: cfg.Logger, secret: cfg.SecretKey},
		HTTPClient:        httpClient,
		EnableTelemetry:   stripe.Bool(false),
	})
	return &SummaryClient{
		meters:    meter.Client{B: backend, Key: cfg.SecretKey},
		summaries: metereventsummary.Client{B: backend, Key: cfg.SecretKey},
		secretKey: cfg.SecretKey,
		apiBase:   cfg.APIBase,
		pageSize:  DefaultSummaryPageSize,
		log:       cfg.Logger,
	}, nil
}

// WithPageSize returns a copy of c that asks for n items per page (1 to
// 100), e.g. to exercise pagination in tests.
func (c *SummaryClient) WithPageSize(n int64) *SummaryClient {
	out := *c
	out.pageSize = min(max(n, 1), 100)
	return &out
}

// String keeps the secret key out of fmt's %v and %+v.
func (c SummaryClient) String() string {
	return fmt.Sprintf("stripeclient.SummaryClient{APIBase:%q SecretKey:%s}", c.apiBase, redactedKey(c.secretKey))
}

// GoString keeps the secret key out of fmt's %#v.
func (c SummaryClient) GoString() string { return c.String() }

// LogValue keeps the secret key out of slog.
func (c SummaryClient) LogValue() slog.Value {
	return slog.GroupValue(slog.String("api_base", c.apiBase), slog.String("secret_key", redactedKey(c.secretKey)))
}

// Meters lists every meter of the account, newest first as Stripe lists
// them. Errors are *Error.
func (c *SummaryClient) Meters(ctx context.Context) ([]Meter, error) {
	var out []Meter
	err := c.listWithRetry(ctx, "listing billing meters", func(ctx context.Context) error {
		out = out[:0]
		params := &stripe.BillingMeterListParams{}
		params.Context = ctx
		params.Limit = stripe.Int64(c.pageSize)
		it := c.meters.List(params)
		for it.Next() {
			m := it.BillingMeter()
			mm := Meter{ID: m.ID, EventName: m.EventName, Status: string(m.Status)}
			if m.DefaultAggregation != nil {
				mm.Formula = string(m.DefaultAggregation.Formula)
			}
			if m.CustomerMapping != nil {
				mm.CustomerPayloadKey = m.CustomerMapping.EventPayloadKey
			}
			if m.ValueSettings != nil {
				mm.ValuePayloadKey = m.ValueSettings.EventPayloadKey
			}
			out = append(out, mm)
		}
		return it.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DailySummaries lists the summaries of one meter and customer over
// [start, end) with value_grouping_window=day. It returns them as Stripe
// sent them; checking that each is one UTC day is the caller's business.
// Errors are *Error; a misaligned window is refused before anything is
// sent.
func (c *SummaryClient) DailySummaries(ctx context.Context, meterID, customer string, start, end time.Time) ([]EventSummary, error) {
	switch {
	case meterID == "":
		return nil, localError(KindPermanent, "not sent: no meter id", nil)
	case customer == "":
		return nil, localError(KindPermanent, "not sent: no customer", nil)
	case !summaryDayAligned(start) || !summaryDayAligned(end):
		return nil, localError(KindPermanent, fmt.Sprintf(
			"not sent: summary window [%s, %s) must start and end at midnight UTC for value_grouping_window=day",
			start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339)), nil)
	case !start.Before(end):
		return nil, localError(KindPermanent, "not sent: summary window start must be before its end", nil)
	}
	var out []EventSummary
	what := fmt.Sprintf("listing event summaries of meter %s for customer %s", meterID, customer)
	err := c.listWithRetry(ctx, what, func(ctx context.Context) error {
		out = out[:0]
		params := &stripe.BillingMeterEventSummaryListParams{
			ID:                  stripe.String(meterID),
			Customer:            stripe.String(customer),
			StartTime:           stripe.Int64(start.Unix()),
			EndTime:             stripe.Int64(end.Unix()),
			ValueGroupingWindow: stripe.String("day"),
		}
		params.Context = ctx
		params.Limit = stripe.Int64(c.pageSize)
		it := c.summaries.List(params)
		for it.Next() {
			s := it.BillingMeterEventSummary()
			out = append(out, EventSummary{
				Start: time.Unix(s.StartTime, 0).UTC(),
				End:   time.Unix(s.EndTime, 0).UTC(),
				Value: s.AggregatedValue,
			})
		}
		return it.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// listWithRetry runs one whole listing, and again from the start after a
// retryable error, classifying errors with mapOutcome like every other
// Stripe call of this package.
func (c *SummaryClient) listWithRetry(ctx context.Context, what string, list func(context.Context) error) error {
	backoff := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		obs := &observation{}
		callErr := list(context.WithValue(ctx, observationKey{}, obs))
		if callErr == nil {
			return nil
		}
		// No identifier can be "already applied" on a read; the NUL key
		// matches no message.
		_, err := mapOutcome("\x00", nil, callErr, obs)
		var se *Error
		if !errors.As(err, &se) {
			se = &Error{Kind: KindPermanent, Message: "unclassified error", Err: callErr}
		}
		se.Message = what + ": " + se.Message
		if se.Kind != KindRetryable || attempt == summaryAttempts || ctx.Err() != nil {
			return se
		}
		wait := max(backoff, se.RetryAfter)
		c.log.Debug("stripe read failed; listing again", slog.String("what", what),
			slog.Int("attempt", attempt), slog.Duration("wait", wait),
			slog.String("error", scrub(se.Error(), c.secretKey)))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return se
		case <-t.C:
		}
		backoff *= 2
	}
}

func summaryDayAligned(t time.Time) bool {
	return !t.IsZero() && t.Equal(t.UTC().Truncate(24*time.Hour))
}

// summaryLimitedTransport waits for the rate limiter before every request
// (every page of a list), honouring the request's context.
type summaryLimitedTransport struct {
	base    http.RoundTripper
	limiter *rate.Limiter
}

func (t summaryLimitedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := t.limiter.Wait(req.Context()); err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("waiting for the rate limiter: %w", err)
	}
	return t.base.RoundTrip(req)
}
