// Package emulator is a local, stateful emulator of the part of the Stripe
// API this project uses, served over real HTTP (normally on loopback). Unlike
// stripe-mock, which only checks request shape, it keeps state and follows
// Stripe's rules, so tests can see what Stripe would have recorded:
//
//   - POST /v1/billing/meter_events with idempotency keys (saved, replayed
//     with Idempotent-Replayed: true, idempotency_error on changed
//     parameters, 409 while the first request is in flight, forgotten after
//     KeyTTL), the identifier rule (400 "An event already exists with
//     identifier ..." with Stripe-Should-Retry: false within IdentifierTTL),
//     and 429 for a second concurrent call on one (customer, event name);
//   - GET /v1/customers/{id} and POST /v1/customers: the customers it was
//     told of, created, or billed (customers.go), 404 resource_missing for
//     any other;
//   - GET /v1/billing/meters, GET /v1/billing/meters/{id} and
//     GET /v1/billing/meters/{id}/event_summaries over what was applied;
//   - seeded fault injection: 500s, 429s, lost responses (applied, saved,
//     connection dropped), latency and black-holed customers.
//
// Each API key is its own account for idempotency keys and identifiers, as
// on Stripe; meters, totals and summaries are shared by all keys. Every
// response carries a Request-Id, and errors have Stripe's
// {"error":{"type","code","message","param"}} shape.
//
// Tests read the emulator's state directly (Applied, Events, AppliedCount,
// Requests); a separate process can read it as JSON under /_emulator/ (see
// Handler). Those control endpoints are not part of Stripe's API and are not
// authenticated: bind the emulator to loopback.
package emulator

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/overage-billing/overage"
	"golang.org/x/time/rate"
)

// Faults are the injected failures. Rates are probabilities in [0, 1],
// drawn from the emulator's seeded generator: for a given seed, the same
// sequence of meter-event requests meets the same faults.
type Faults struct {
	// ServerErrorRate: answer 500 before doing anything; nothing applied,
	// nothing saved under the idempotency key.
	ServerErrorRate float64 `json:"server_error_rate"`
	// LostResponseRate: of the events freshly applied, the fraction whose
	// answer is lost: the event is applied and its response saved under the
	// idempotency key, then the connection is closed without an answer.
	LostResponseRate float64 `json:"lost_response_rate"`
	// RateLimitRate: answer 429 rate_limit before doing anything.
	RateLimitRate float64 `json:"rate_limit_rate"`
	// Latency is added to every meter-event request while it holds its
	// (customer, event name) slot.
	Latency time.Duration `json:"latency"`
	// AnswerDelay holds the answer of an applied event this long after it
	// was applied and saved: the window in which a client that dies has
	// had its event applied without learning it (a kill -9 between send
	// and commit).
	AnswerDelay time.Duration `json:"answer_delay"`
	// BlackholeCustomers never get an answer: the request is held until
	// the client gives up or the emulator closes, and nothing is applied.
	BlackholeCustomers []string `json:"blackhole_customers,omitempty"`
}

// Options configure an Emulator. The zero value is usable.
type Options struct {
	// Seed seeds fault injection.
	Seed int64
	// Faults in force from the start; change them with SetFaults.
	Faults Faults
	// KeyTTL is how long an idempotency key is remembered (default 24h).
	KeyTTL time.Duration
	// IdentifierTTL is how long a meter event identifier is unique
	// (default 24h).
	IdentifierTTL time.Duration
	// APIKeys, when non-nil, are the only secret keys accepted; otherwise
	// any key starting with sk_ or rk_ is.
	APIKeys []string
	// Customers, when non-nil, is the allow-list of customer ids; a meter
	// event for any other customer gets 400 resource_missing. Nil accepts
	// every customer.
	Customers []string
	// FailCustomers maps a customer id to a message: meter events for that
	// customer get 400 invalid_request_error with that message, to exercise
	// permanent failures. Change at runtime with SetCustomerFailure.
	FailCustomers map[string]string
	// Meters are event names that have a meter from the start. A meter is
	// also created for every event name seen.
	Meters []string
	// RateLimit is each account's limit of meter event calls per second,
	// as Stripe's live mode enforces it: a call above it gets 429
	// rate_limit before anything else is checked. 0 means
	// DefaultRateLimit; negative means no limit. Bursts of a tenth of a
	// second's worth are allowed, as a token bucket does.
	RateLimit float64
	// Now is the emulator's clock (default time.Now), for tests of the
	// TTLs and timestamp bounds.
	Now func() time.Time
	// Logger receives one debug line per request (default: discard).
	Logger *slog.Logger
}

// Default TTLs, Stripe's documented windows, and Stripe's live-mode limit
// of meter event calls per second and account.
const (
	DefaultKeyTTL        = overage.StripeIdempotencyWindow
	DefaultIdentifierTTL = overage.StripeIdempotencyWindow
	DefaultRateLimit     = 1000.0
)

// Outcomes recorded in Request.Outcome.
const (
	OutcomePending             = "pending" // still being handled
	OutcomeApplied             = "applied"
	OutcomeLostResponse        = "lost_response" // applied and saved, answer dropped
	OutcomeReplayed            = "replayed"
	OutcomeAlreadyExists       = "already_exists"
	OutcomeIdempotencyError    = "idempotency_error"
	OutcomeKeyInUse            = "idempotency_key_in_use"
	OutcomeConcurrentRateLimit = "concurrent_rate_limited"
	OutcomeRateLimited         = "rate_limited" // above the account's calls per second
	OutcomeFaultServerError    = "fault_500"
	OutcomeFaultRateLimit      = "fault_429"
	OutcomeBlackholed          = "blackholed"
	OutcomeClientGone          = "client_gone" // client left during latency; nothing applied
	OutcomeInvalid             = "invalid_request"
	OutcomeUnknownCustomer     = "unknown_customer"
	OutcomeCustomerFailure     = "customer_failure"
	OutcomeUnauthorized        = "unauthorized"
	OutcomeNotFound            = "not_found"
	OutcomeOK                  = "ok" // a read
)

// AppliedKey identifies a meter's usage for one customer.
type AppliedKey struct {
	Customer  string
	EventName string
}

// AppliedEvent is one meter event the emulator applied.
type AppliedEvent struct {
	Identifier     string    `json:"identifier"`
	IdempotencyKey string    `json:"idempotency_key"`
	Customer       string    `json:"customer"`
	EventName      string    `json:"event_name"`
	Value          int64     `json:"value"`
	Timestamp      time.Time `json:"timestamp"`
	AppliedAt      time.Time `json:"applied_at"`
}

// Request is one request the emulator received, whatever became of it.
type Request struct {
	Method         string    `json:"method"`
	Path           string    `json:"path"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Identifier     string    `json:"identifier,omitempty"`
	Customer       string    `json:"customer,omitempty"`
	EventName      string    `json:"event_name,omitempty"`
	Value          int64     `json:"value,omitempty"`
	ReceivedAt     time.Time `json:"received_at"` // by Options.Now
	Status         int       `json:"status"`      // 0 when no answer was given
	Outcome        string    `json:"outcome"`
	RequestID      string    `json:"request_id"`
}

// Emulator is a stateful Stripe emulator. Its methods are safe for
// concurrent use.
type Emulator struct {
	keyTTL, identifierTTL time.Duration
	apiKeys               map[string]bool // nil: any sk_/rk_ key
	customers             map[string]bool // nil: any customer
	now                   func() time.Time
	log                   *slog.Logger
	handler               http.Handler

	closed    chan struct{}
	closeOnce sync.Once

	rateLimit float64
	limitMu   sync.Mutex
	limiters  map[string]*rate.Limiter // by account

	faultMu   sync.Mutex
	faults    Faults
	blackhole map[string]bool
	rng       *rand.Rand

	mu            sync.Mutex
	srv           *http.Server
	started       bool
	idem          map[scopedKey]*idemEntry
	identifiers   map[scopedKey]time.Time // applied at
	slots         map[slotKey]bool
	events        []AppliedEvent
	appliedCount  map[string]int
	requests      []*Request
	meters        map[string]*meter // by event name
	meterIDs      map[string]*meter // by id
	failCustomers map[string]string
	// knownCustomers and deletedCustomers answer GET /v1/customers/{id}
	// (customers.go).
	knownCustomers   map[string]bool
	deletedCustomers map[string]bool
	reqSeq           uint64
	meterSeq         uint64
	applies          uint64 // endpoint executions, to pace purgeExpiredLocked
}

// scopedKey is an idempotency key or identifier within one account (API key).
type scopedKey struct {
	account string
	key     string
}

type slotKey struct {
	customer  string
	eventName string
}

type idemEntry struct {
	fingerprint string
	created     time.Time
	done        bool
	status      int
	body        []byte
	header      http.Header // headers to replay besides the standard ones
	requestID   string
}

type meter struct {
	id        string
	eventName string
	created   int64
}

// New builds an emulator. Serve it with Start, or mount Handler yourself.
func New(opts Options) *Emulator {
	e := &Emulator{
		keyTTL:         opts.KeyTTL,
		identifierTTL:  opts.IdentifierTTL,
		now:            opts.Now,
		log:            opts.Logger,
		closed:         make(chan struct{}),
		rng:            rand.New(rand.NewPCG(uint64(opts.Seed), 0x5eed)),
		idem:           make(map[scopedKey]*idemEntry),
		identifiers:    make(map[scopedKey]time.Time),
		slots:          make(map[slotKey]bool),
		appliedCount:   make(map[string]int),
		meters:         make(map[string]*meter),
		meterIDs:       make(map[string]*meter),
		failCustomers:  make(map[string]string),
		knownCustomers: make(map[string]bool), deletedCustomers: make(map[string]bool),
		rateLimit: opts.RateLimit,
		limiters:  make(map[string]*rate.Limiter),
	}
	if e.rateLimit == 0 {
		e.rateLimit = DefaultRateLimit
	}
	if e.keyTTL <= 0 {
		e.keyTTL = DefaultKeyTTL
	}
	if e.identifierTTL <= 0 {
		e.identifierTTL = DefaultIdentifierTTL
	}
	if e.now == nil {
		e.now = time.Now
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if opts.APIKeys != nil {
		e.apiKeys = make(map[string]bool, len(opts.APIKeys))
		for _, k := range opts.APIKeys {
			e.apiKeys[k] = true
		}
	}
	if opts.Customers != nil {
		e.customers = make(map[string]bool, len(opts.Customers))
		for _, c := range opts.Customers {
			e.customers[c] = true
		}
	}
	for c, msg := range opts.FailCustomers {
		e.failCustomers[c] = msg
	}
	e.SetFaults(opts.Faults)
	for _, name := range opts.Meters {
		e.meterFor(name)
	}
	e.handler = http.HandlerFunc(e.serveHTTP)
	return e
}

// Start serves the emulator on addr ("127.0.0.1:0" picks a free port) and
// returns its base URL, e.g. "http://127.0.0.1:41234", to use as the Stripe
// API base. It serves until Close.
func (e *Emulator) Start(addr string) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started {
		return "", errors.New("emulator: already started")
	}
	select {
	case <-e.closed:
		return "", errors.New("emulator: closed")
	default:
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("emulator: listen on %s: %w", addr, err)
	}
	e.srv = &http.Server{Handler: e.handler, ReadHeaderTimeout: 10 * time.Second}
	e.started = true
	srv := e.srv
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.log.Error("emulator stopped serving", slog.String("error", err.Error()))
		}
	}()
	return "http://" + ln.Addr().String(), nil
}

// Close stops serving, drops open connections and releases held
// (black-holed or delayed) requests. It is safe to call more than once.
func (e *Emulator) Close() {
	e.closeOnce.Do(func() {
		close(e.closed)
		e.mu.Lock()
		srv := e.srv
		e.mu.Unlock()
		if srv != nil {
			_ = srv.Close()
		}
	})
}

// Handler serves the Stripe endpoints and the /_emulator/ control endpoints:
// GET /_emulator/applied, /_emulator/events, /_emulator/requests, and
// GET or POST /_emulator/faults (JSON with server_error_rate,
// lost_response_rate, rate_limit_rate, latency as a Go duration string, and
// blackhole_customers).
func (e *Emulator) Handler() http.Handler { return e.handler }

// SetFaults replaces the injected faults. The seeded sequence continues.
func (e *Emulator) SetFaults(f Faults) {
	f.BlackholeCustomers = slices.Clone(f.BlackholeCustomers)
	bh := make(map[string]bool, len(f.BlackholeCustomers))
	for _, c := range f.BlackholeCustomers {
		bh[c] = true
	}
	e.faultMu.Lock()
	e.faults = f
	e.blackhole = bh
	e.faultMu.Unlock()
}

// Faults returns the faults in force.
func (e *Emulator) Faults() Faults {
	e.faultMu.Lock()
	defer e.faultMu.Unlock()
	f := e.faults
	f.BlackholeCustomers = slices.Clone(f.BlackholeCustomers)
	return f
}

// SetCustomerFailure makes meter events for customer fail with a 400 and
// message; an empty message removes the failure.
func (e *Emulator) SetCustomerFailure(customer, message string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if message == "" {
		delete(e.failCustomers, customer)
		return
	}
	e.failCustomers[customer] = message
}

// Applied returns the total value applied per (customer, event name).
func (e *Emulator) Applied() map[AppliedKey]int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[AppliedKey]int64)
	for _, ev := range e.events {
		out[AppliedKey{Customer: ev.Customer, EventName: ev.EventName}] += ev.Value
	}
	return out
}

// Events returns every applied meter event, in the order applied.
func (e *Emulator) Events() []AppliedEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.events)
}

// AppliedCount is how many times an event with this identifier was applied,
// in any account. Exactly-once delivery means it never exceeds 1 (it can
// only do so after IdentifierTTL, as on Stripe).
func (e *Emulator) AppliedCount(identifier string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.appliedCount[identifier]
}

// Requests returns a copy of every request received, in order of arrival,
// including those still being handled (Outcome "pending").
func (e *Emulator) Requests() []Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Request, len(e.requests))
	for i, r := range e.requests {
		out[i] = *r
	}
	return out
}

// InFlight is the number of meter-event requests currently holding a
// (customer, event name) slot, i.e. being processed.
func (e *Emulator) InFlight() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.slots)
}

// MeterID returns the id of the meter for eventName, creating it if needed.
func (e *Emulator) MeterID(eventName string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.meterForLocked(eventName).id
}

func (e *Emulator) meterFor(eventName string) *meter {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.meterForLocked(eventName)
}

func (e *Emulator) meterForLocked(eventName string) *meter {
	if m, ok := e.meters[eventName]; ok {
		return m
	}
	e.meterSeq++
	m := &meter{
		id:        fmt.Sprintf("mtr_emu%010d", e.meterSeq),
		eventName: eventName,
		created:   e.now().Unix(),
	}
	e.meters[eventName] = m
	e.meterIDs[m.id] = m
	return m
}

// metersNewestFirst lists meters as Stripe lists objects: newest first.
func (e *Emulator) metersNewestFirst() []*meter {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*meter, 0, len(e.meters))
	for _, m := range e.meters {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id > out[j].id })
	return out
}

// drawFaults takes the same three draws for every meter-event request, so
// the sequence of outcomes for a seed does not depend on which rates are set.
func (e *Emulator) drawFaults(customer string) (serverError, rateLimit, lose, blackhole bool, latency time.Duration) {
	e.faultMu.Lock()
	defer e.faultMu.Unlock()
	r1, r2, r3 := e.rng.Float64(), e.rng.Float64(), e.rng.Float64()
	return r1 < e.faults.ServerErrorRate, r2 < e.faults.RateLimitRate, r3 < e.faults.LostResponseRate,
		e.blackhole[customer], e.faults.Latency
}

func (e *Emulator) answerDelay() time.Duration {
	e.faultMu.Lock()
	defer e.faultMu.Unlock()
	return e.faults.AnswerDelay
}

func (e *Emulator) newRequestID() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reqSeq++
	return fmt.Sprintf("req_emu%010d", e.reqSeq)
}

func (e *Emulator) record(r *http.Request, requestID string, form url.Values) *Request {
	rec := &Request{
		Method:     r.Method,
		Path:       r.URL.Path,
		ReceivedAt: e.now(),
		Outcome:    OutcomePending,
		RequestID:  requestID,
	}
	if r.Method == http.MethodPost {
		rec.IdempotencyKey = strings.TrimSpace(r.Header.Get("Idempotency-Key"))
		rec.Identifier = form.Get("identifier")
		rec.Customer = form.Get("payload[stripe_customer_id]")
		rec.EventName = form.Get("event_name")
		rec.Value, _ = strconv.ParseInt(form.Get("payload[value]"), 10, 64)
	}
	e.mu.Lock()
	e.requests = append(e.requests, rec)
	e.mu.Unlock()
	return rec
}

// update changes a recorded request under the lock, since Requests may be
// copying it concurrently.
func (e *Emulator) update(rec *Request, fn func(*Request)) {
	e.mu.Lock()
	fn(rec)
	e.mu.Unlock()
}

// finish records a request's answer. Handlers call it before writing the
// answer, so a client that has its response always finds it recorded.
func (e *Emulator) finish(rec *Request, status int, outcome string) {
	e.update(rec, func(r *Request) {
		r.Status = status
		r.Outcome = outcome
	})
	e.log.Debug("emulator request",
		slog.String("method", rec.Method), slog.String("path", rec.Path),
		slog.String("idempotency_key", rec.IdempotencyKey), slog.Int("status", status),
		slog.String("outcome", outcome))
}

// allowCall spends one of the account's calls of this second; false means
// the account is above its rate limit.
func (e *Emulator) allowCall(account string) bool {
	if e.rateLimit < 0 {
		return true
	}
	e.limitMu.Lock()
	defer e.limitMu.Unlock()
	l, ok := e.limiters[account]
	if !ok {
		l = rate.NewLimiter(rate.Limit(e.rateLimit), max(1, int(e.rateLimit/10)))
		e.limiters[account] = l
	}
	return l.AllowN(e.now(), 1)
}
