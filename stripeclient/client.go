package stripeclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meterevent"
	"golang.org/x/time/rate"
)

// Defaults for Config.
const (
	DefaultAPIBase     = "https://api.stripe.com"
	DefaultRateLimit   = 1000.0 // Stripe's live-mode meter-event limit per account, calls/s
	DefaultHTTPTimeout = 80 * time.Second
	// DefaultSlowCallAfter is when a call in flight for a customer's meter
	// counts as slow, and DefaultMaxQueuedPerMeter how many calls may then
	// stay queued behind it (see Config).
	DefaultSlowCallAfter     = 3 * time.Second
	DefaultMaxQueuedPerMeter = 2
	// MaxKeyLength is Stripe's limit on a meter event identifier; the key is
	// used as one, so it is the binding limit (idempotency keys allow 255).
	MaxKeyLength = 100
)

// MeterEvent is one meter event, exactly as it will be sent.
type MeterEvent struct {
	EventName  string    // meter event name, e.g. llm_input_tokens
	CustomerID string    // payload[stripe_customer_id]
	Value      int64     // payload[value], the overage; negative for a correction giving overage back, never 0
	Timestamp  time.Time // the usage's timestamp (sent in whole seconds)
	Key        string    // used as BOTH the Idempotency-Key header and the meter event identifier
}

// Result is the outcome of an accepted meter event.
type Result struct {
	// AlreadyApplied: Stripe answered 400 "An event already exists with
	// identifier ..." naming our key, so an earlier send was applied. It
	// counts as accepted.
	AlreadyApplied bool
	// Replayed: Stripe replayed its saved response for our idempotency key
	// (header Idempotent-Replayed: true); the event was applied once, earlier.
	Replayed bool
	// RequestID is Stripe's Request-Id of the answer.
	RequestID string
}

// Sender sends one meter event. *Client implements it; tests of callers may
// provide their own.
type Sender interface {
	SendMeterEvent(ctx context.Context, ev MeterEvent) (Result, error)
}

// Config configures a Client. The zero value of every field but SecretKey
// means its default.
type Config struct {
	SecretKey string  // required; never logged
	APIBase   string  // default DefaultAPIBase
	RateLimit float64 // calls/s across this client, default DefaultRateLimit
	Burst     int     // token-bucket burst, default 1
	// MaxNetworkRetries is stripe-go's own retry count, default 0, at most
	// 1: its sleep between retries ignores the context and would hold the
	// per-customer lock, so retrying is left to the caller's backoff.
	MaxNetworkRetries int64
	// Calls for one customer's meter wait in line behind the one in
	// flight. Once that call has taken SlowCallAfter (default
	// DefaultSlowCallAfter), at most MaxQueuedPerMeter (default
	// DefaultMaxQueuedPerMeter) stay in line; the others are refused, unsent,
	// with an error IsBusy recognises, so a customer whose calls hang cannot
	// hold every caller of the process.
	SlowCallAfter     time.Duration
	MaxQueuedPerMeter int
	HTTPClient        *http.Client // default: 80 s timeout, its own transport
	Logger            *slog.Logger // default: discard
}

// String keeps the secret key out of fmt's %v and %+v.
func (c Config) String() string {
	return fmt.Sprintf("stripeclient.Config{SecretKey:%s APIBase:%q RateLimit:%v Burst:%d MaxNetworkRetries:%d}",
		redactedKey(c.SecretKey), c.APIBase, c.RateLimit, c.Burst, c.MaxNetworkRetries)
}

// GoString keeps the secret key out of fmt's %#v.
func (c Config) GoString() string { return c.String() }

// LogValue keeps the secret key out of slog.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("secret_key", redactedKey(c.SecretKey)),
		slog.String("api_base", c.APIBase),
		slog.Float64("rate_limit", c.RateLimit),
		slog.Int("burst", c.Burst),
		slog.Int64("max_network_retries", c.MaxNetworkRetries),
	)
}

// redactedKey shows only what kind of key it is (sk_test, rk_live, ...).
func redactedKey(key string) string {
	if key == "" {
		return `""`
	}
	parts := strings.SplitN(key, "_", 3)
	if len(parts) == 3 {
		return parts[0] + "_" + parts[1] + "_" + redacted
	}
	return redacted
}

// Client sends meter events to Stripe. It is safe for concurrent use.
type Client struct {
	events    meterevent.Client
	customers customerClient
	secretKey string
	apiBase   string
	limiter   *rate.Limiter
	locks     *keyedLock
	lockLimit int           // holder + waiters per (customer, event name) once slow
	slowCall  time.Duration // when the holder counts as slow
	log       *slog.Logger
}

var _ Sender = (*Client)(nil)

// New validates cfg and builds a Client. It uses no stripe-go globals.
func New(cfg Config) (*Client, error) {
	if cfg.SecretKey == "" {
		return nil, errors.New("stripeclient: secret key is required")
	}
	if strings.TrimSpace(cfg.SecretKey) != cfg.SecretKey || strings.ContainsAny(cfg.SecretKey, " \t\r\n") {
		return nil, errors.New("stripeclient: secret key contains whitespace")
	}
	if !strings.HasPrefix(cfg.SecretKey, "sk_") && !strings.HasPrefix(cfg.SecretKey, "rk_") {
		// Deliberately does not echo the key: a publishable or webhook key
		// pasted here is still a credential.
		return nil, errors.New("stripeclient: secret key must be a secret (sk_) or restricted (rk_) key")
	}
	if cfg.APIBase == "" {
		cfg.APIBase = DefaultAPIBase
	}
	u, err := url.Parse(cfg.APIBase)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("stripeclient: API base %q must be an http(s) URL", cfg.APIBase)
	}
	if cfg.RateLimit == 0 {
		cfg.RateLimit = DefaultRateLimit
	}
	if cfg.RateLimit < 0 || math.IsNaN(cfg.RateLimit) || math.IsInf(cfg.RateLimit, 0) {
		return nil, fmt.Errorf("stripeclient: rate limit %v must be a positive number of calls per second", cfg.RateLimit)
	}
	if cfg.Burst == 0 {
		cfg.Burst = 1
	}
	if cfg.Burst < 0 {
		return nil, fmt.Errorf("stripeclient: burst %d must be positive", cfg.Burst)
	}
	if cfg.MaxNetworkRetries < 0 || cfg.MaxNetworkRetries > 1 {
		return nil, fmt.Errorf("stripeclient: max network retries %d must be 0 or 1", cfg.MaxNetworkRetries)
	}
	if cfg.MaxQueuedPerMeter == 0 {
		cfg.MaxQueuedPerMeter = DefaultMaxQueuedPerMeter
	}
	if cfg.MaxQueuedPerMeter < 0 {
		return nil, fmt.Errorf("stripeclient: max queued per meter %d must be positive", cfg.MaxQueuedPerMeter)
	}
	if cfg.SlowCallAfter == 0 {
		cfg.SlowCallAfter = DefaultSlowCallAfter
	}
	if cfg.SlowCallAfter < 0 {
		return nil, fmt.Errorf("stripeclient: slow call threshold %s must be positive", cfg.SlowCallAfter)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}

	httpClient := observingClient(cfg.HTTPClient)
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(cfg.APIBase),
		MaxNetworkRetries: stripe.Int64(cfg.MaxNetworkRetries),
		LeveledLogger:     slogLeveled{log: cfg.Logger, secret: cfg.SecretKey},
		HTTPClient:        httpClient,
		EnableTelemetry:   stripe.Bool(false),
	})

	c := &Client{
		events:    meterevent.Client{B: backend, Key: cfg.SecretKey},
		customers: customerClient{B: backend, Key: cfg.SecretKey},
		secretKey: cfg.SecretKey,
		apiBase:   cfg.APIBase,
		limiter:   rate.NewLimiter(rate.Limit(cfg.RateLimit), cfg.Burst),
		locks:     newKeyedLock(),
		lockLimit: 1 + cfg.MaxQueuedPerMeter,
		slowCall:  cfg.SlowCallAfter,
		log:       cfg.Logger,
	}
	c.log.Debug("stripe client configured", slog.Any("config", cfg))
	return c, nil
}

// String keeps the secret key out of fmt's %v and %+v.
func (c Client) String() string {
	return fmt.Sprintf("stripeclient.Client{APIBase:%q SecretKey:%s}", c.apiBase, redactedKey(c.secretKey))
}

// GoString keeps the secret key out of fmt's %#v.
func (c Client) GoString() string { return c.String() }

// LogValue keeps the secret key out of slog.
func (c Client) LogValue() slog.Value {
	return slog.GroupValue(slog.String("api_base", c.apiBase), slog.String("secret_key", redactedKey(c.secretKey)))
}

// SendMeterEvent sends ev once, with ev.Key as both the Idempotency-Key and
// the identifier, and classifies the outcome. Every error is an *Error. An
// event without a usable key is refused with a permanent error and nothing is
// sent: stripe-go would otherwise invent a random key, and a retry of that
// call could bill twice.
//
// It waits for the (customer, event name) lock and for the rate limiter
// first; if ctx ends while waiting, nothing is sent and the error is
// retryable. Behind a call that has been in flight for SlowCallAfter, it
// may instead return, unsent, a retryable error IsBusy recognises, whose
// RetryAfter grows with how long that call has taken.
func (c *Client) SendMeterEvent(ctx context.Context, ev MeterEvent) (Result, error) {
	if err := ev.validate(); err != nil {
		return Result{}, err
	}

	unlock, err := c.locks.lock(ctx, ev.CustomerID+"\x00"+ev.EventName, c.lockLimit, c.slowCall)
	var busy *busyError
	if errors.As(err, &busy) {
		e := localError(KindRetryable, "not sent: a call for this customer's meter has been in flight for "+busy.heldFor.Round(time.Millisecond).String()+" and others are queued behind it", err)
		e.RetryAfter = min(max(busy.heldFor, time.Second), 30*time.Second)
		return Result{}, e
	}
	if err != nil {
		return Result{}, localError(KindRetryable, "not sent: context ended while waiting for the customer's meter lock", err)
	}
	defer unlock()

	if err := c.limiter.Wait(ctx); err != nil {
		return Result{}, localError(KindRetryable, "not sent: context ended while waiting for the rate limiter", err)
	}

	obs := &observation{}
	params := &stripe.BillingMeterEventParams{
		EventName:  stripe.String(ev.EventName),
		Identifier: stripe.String(ev.Key),
		Payload: map[string]string{
			"stripe_customer_id": ev.CustomerID,
			"value":              strconv.FormatInt(ev.Value, 10),
		},
		Timestamp: stripe.Int64(ev.Timestamp.Unix()),
	}
	params.Context = context.WithValue(ctx, observationKey{}, obs)
	params.IdempotencyKey = stripe.String(ev.Key)

	out, callErr := c.events.New(params)
	var resp *stripe.APIResponse
	if out != nil {
		resp = out.LastResponse
	}
	res, err := mapOutcome(ev.Key, resp, callErr, obs)

	attrs := []any{
		slog.String("key", ev.Key),
		slog.String("customer", ev.CustomerID),
		slog.String("event_name", ev.EventName),
		slog.Int64("value", ev.Value),
	}
	if err != nil {
		c.log.Debug("meter event not accepted", append(attrs, slog.String("error", scrub(err.Error(), c.secretKey)))...)
		return Result{}, err
	}
	c.log.Debug("meter event accepted", append(attrs,
		slog.String("request_id", res.RequestID),
		slog.Bool("replayed", res.Replayed),
		slog.Bool("already_applied", res.AlreadyApplied))...)
	return res, nil
}

func (ev MeterEvent) validate() error {
	refuse := func(format string, args ...any) error {
		return localError(KindPermanent, "not sent: "+fmt.Sprintf(format, args...), nil)
	}
	switch {
	case ev.Key == "":
		return refuse("meter event has no idempotency key")
	case len(ev.Key) > MaxKeyLength:
		return refuse("key is %d bytes, longer than Stripe's %d for an identifier", len(ev.Key), MaxKeyLength)
	case !printableASCII(ev.Key):
		// stripe-go trims the header but not the identifier, so whitespace
		// would make the two differ.
		return refuse("key %q must be printable ASCII without spaces", ev.Key)
	case ev.EventName == "":
		return refuse("meter event has no event name")
	case len(ev.EventName) > 100:
		return refuse("event name is longer than 100 bytes")
	case ev.CustomerID == "":
		return refuse("meter event has no customer")
	case ev.Value == 0:
		// A negative value is valid: a correction giving overage back.
		return refuse("value is zero: nothing to send")
	case ev.Timestamp.IsZero():
		return refuse("meter event has no timestamp")
	}
	return nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// observationKey carries the per-call *observation through the request
// context from SendMeterEvent to observingTransport.
type observationKey struct{}

type observingTransport struct {
	base http.RoundTripper
}

func (t observingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if obs, ok := req.Context().Value(observationKey{}).(*observation); ok {
		// Overwritten on every attempt, so after stripe-go's own retry it
		// describes the attempt whose outcome is returned.
		if err == nil {
			obs.status, obs.header = resp.StatusCode, resp.Header.Clone()
		} else {
			obs.status, obs.header = 0, nil
		}
	}
	return resp, err
}

// observingClient returns a copy of hc (or a default client) whose transport
// records the last response's status and headers for mapOutcome.
func observingClient(hc *http.Client) *http.Client {
	var out http.Client
	if hc != nil {
		out = *hc
	} else {
		out.Timeout = DefaultHTTPTimeout
		t := http.DefaultTransport.(*http.Transport).Clone()
		// Reports run concurrently against one host; the default of two
		// idle connections per host would make most calls a new TCP (and
		// TLS) handshake.
		t.MaxIdleConns, t.MaxIdleConnsPerHost = 512, 512
		out.Transport = t
	}
	base := out.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	out.Transport = observingTransport{base: base}
	return &out
}
