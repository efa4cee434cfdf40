package stripeclient_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meterevent"

	"github.com/overage-billing/overage/internal/testkit/fakeclock"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/syncbuf"
	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

// secretKey is distinctive so a leak into logs or errors is found by a
// plain substring search.
const secretKey = "sk_test_51SeCrEtKeyThatMustNeverBeLogged0042"

func event(customer, key string) stripeclient.MeterEvent {
	return stripeclient.MeterEvent{
		EventName:  "llm_input_tokens",
		CustomerID: customer,
		Value:      250,
		Timestamp:  time.Now().Add(-time.Minute),
		Key:        key,
	}
}

func startEmulator(t *testing.T, opts emulator.Options) (*emulator.Emulator, string) {
	t.Helper()
	emu := emulator.New(opts)
	t.Cleanup(emu.Close)
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatalf("starting emulator: %v", err)
	}
	return emu, base
}

func newClient(t *testing.T, cfg stripeclient.Config) *stripeclient.Client {
	t.Helper()
	if cfg.SecretKey == "" {
		cfg.SecretKey = secretKey
	}
	c, err := stripeclient.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  stripeclient.Config
	}{
		{"no key", stripeclient.Config{}},
		{"publishable key", stripeclient.Config{SecretKey: "pk_test_51SeCrEt"}},
		{"key with whitespace", stripeclient.Config{SecretKey: secretKey + "\n"}},
		{"relative API base", stripeclient.Config{SecretKey: secretKey, APIBase: "localhost:12111"}},
		{"negative rate", stripeclient.Config{SecretKey: secretKey, RateLimit: -1}},
		{"negative burst", stripeclient.Config{SecretKey: secretKey, Burst: -1}},
		{"two network retries", stripeclient.Config{SecretKey: secretKey, MaxNetworkRetries: 2}},
		{"negative network retries", stripeclient.Config{SecretKey: secretKey, MaxNetworkRetries: -1}},
	} {
		_, err := stripeclient.New(tc.cfg)
		if err == nil {
			t.Errorf("%s: New accepted %v", tc.name, tc.cfg)
			continue
		}
		if strings.Contains(err.Error(), "SeCrEt") {
			t.Errorf("%s: error echoes the key: %v", tc.name, err)
		}
	}
	if _, err := stripeclient.New(stripeclient.Config{SecretKey: "rk_live_restricted"}); err != nil {
		t.Errorf("restricted key refused: %v", err)
	}
}

func TestSendsOnceAndReplays(t *testing.T) {
	t.Parallel()
	emu, base := startEmulator(t, emulator.Options{})
	client := newClient(t, stripeclient.Config{APIBase: base})
	ev := event("cus_1", "usage-log:1:input")

	first, err := client.SendMeterEvent(context.Background(), ev)
	if err != nil || first.Replayed || first.AlreadyApplied || first.RequestID == "" {
		t.Fatalf("first send: %+v, %v", first, err)
	}
	second, err := client.SendMeterEvent(context.Background(), ev)
	if err != nil || !second.Replayed || second.AlreadyApplied {
		t.Fatalf("second send: %+v, %v; want a replay", second, err)
	}
	if n := emu.AppliedCount(ev.Key); n != 1 {
		t.Errorf("AppliedCount %d, want 1", n)
	}
	evs := emu.Events()
	if len(evs) != 1 || evs[0].Value != ev.Value || evs[0].Customer != ev.CustomerID ||
		evs[0].Timestamp.Unix() != ev.Timestamp.Unix() || evs[0].IdempotencyKey != ev.Key || evs[0].Identifier != ev.Key {
		t.Errorf("applied %+v", evs)
	}
}

// Stripe forgets idempotency keys sooner than the pipeline may resend (a
// sweep, a rescued job); the identifier rule then answers "already exists",
// which for our own identifier means the first send landed.
func TestAlreadyAppliedAfterStripeForgotTheKey(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(time.Now())
	emu, base := startEmulator(t, emulator.Options{Now: clock.Now, KeyTTL: time.Hour, IdentifierTTL: 24 * time.Hour})
	client := newClient(t, stripeclient.Config{APIBase: base})
	ev := event("cus_1", "usage-log:2:output")
	ev.Timestamp = clock.Now()

	if _, err := client.SendMeterEvent(context.Background(), ev); err != nil {
		t.Fatalf("first send: %v", err)
	}
	clock.Advance(2 * time.Hour)
	res, err := client.SendMeterEvent(context.Background(), ev)
	if err != nil || !res.AlreadyApplied || res.RequestID == "" {
		t.Fatalf("resend past the key window: %+v, %v; want AlreadyApplied", res, err)
	}
	if n := emu.AppliedCount(ev.Key); n != 1 {
		t.Errorf("AppliedCount %d, want 1", n)
	}
}

func TestAlreadyAppliedWhenIdentifierCameUnderAnotherKey(t *testing.T) {
	t.Parallel()
	emu, base := startEmulator(t, emulator.Options{})
	ev := event("cus_1", "usage-log:3:input")

	// Another sender (an old deploy, a manual replay) used our identifier
	// with a different idempotency key.
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(base), LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}, MaxNetworkRetries: stripe.Int64(0),
	})
	other := meterevent.Client{B: backend, Key: secretKey}
	p := &stripe.BillingMeterEventParams{
		EventName: stripe.String(ev.EventName), Identifier: stripe.String(ev.Key), Timestamp: stripe.Int64(ev.Timestamp.Unix()),
		Payload: map[string]string{"stripe_customer_id": ev.CustomerID, "value": "250"},
	}
	p.IdempotencyKey = stripe.String("someone-else")
	if _, err := other.New(p); err != nil {
		t.Fatalf("other sender: %v", err)
	}

	res, err := newClient(t, stripeclient.Config{APIBase: base}).SendMeterEvent(context.Background(), ev)
	if err != nil || !res.AlreadyApplied {
		t.Fatalf("got %+v, %v; want AlreadyApplied", res, err)
	}
	if n := emu.AppliedCount(ev.Key); n != 1 {
		t.Errorf("AppliedCount %d, want 1", n)
	}
}

func TestLostResponseIsRetryableAndAppliedOnce(t *testing.T) {
	t.Parallel()
	emu, base := startEmulator(t, emulator.Options{Faults: emulator.Faults{LostResponseRate: 1}})
	client := newClient(t, stripeclient.Config{APIBase: base})
	ev := event("cus_1", "usage-log:4:input")

	_, err := client.SendMeterEvent(context.Background(), ev)
	var se *stripeclient.Error
	if !errors.As(err, &se) || se.Kind != stripeclient.KindRetryable || se.HTTPStatus != 0 {
		t.Fatalf("lost response: got %v, want a retryable error with no status", err)
	}
	if n := emu.AppliedCount(ev.Key); n != 1 {
		t.Fatalf("AppliedCount %d after the lost response, want 1 (applied before the loss)", n)
	}

	emu.SetFaults(emulator.Faults{})
	res, err := client.SendMeterEvent(context.Background(), ev)
	if err != nil || !res.Replayed {
		t.Fatalf("retry: %+v, %v; want a replay", res, err)
	}
	if n := emu.AppliedCount(ev.Key); n != 1 {
		t.Errorf("AppliedCount %d after the retry, want 1", n)
	}
	for _, r := range emu.Requests() {
		if r.IdempotencyKey != ev.Key || r.Identifier != ev.Key {
			t.Errorf("attempt sent key %q identifier %q, want %q for both", r.IdempotencyKey, r.Identifier, ev.Key)
		}
	}
}

// stripe-go's own retry (when enabled) must reuse our key, not invent one.
func TestStripeGoNetworkRetryReusesOurKey(t *testing.T) {
	t.Parallel()
	emu, base := startEmulator(t, emulator.Options{Faults: emulator.Faults{LostResponseRate: 1}})
	client := newClient(t, stripeclient.Config{APIBase: base, MaxNetworkRetries: 1})
	ev := event("cus_1", "usage-log:5:input")

	res, err := client.SendMeterEvent(context.Background(), ev)
	if err != nil || !res.Replayed {
		t.Fatalf("got %+v, %v; want the retry's replay", res, err)
	}
	reqs := emu.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	for _, r := range reqs {
		if r.IdempotencyKey != ev.Key {
			t.Errorf("attempt used key %q, want %q", r.IdempotencyKey, ev.Key)
		}
	}
	if n := emu.AppliedCount(ev.Key); n != 1 {
		t.Errorf("AppliedCount %d, want 1", n)
	}
}

func TestRefusesEventsItCannotSendSafely(t *testing.T) {
	t.Parallel()
	emu, base := startEmulator(t, emulator.Options{})
	client := newClient(t, stripeclient.Config{APIBase: base})
	for _, tc := range []struct {
		name   string
		mutate func(*stripeclient.MeterEvent)
	}{
		{"empty key", func(e *stripeclient.MeterEvent) { e.Key = "" }},
		{"key with a space", func(e *stripeclient.MeterEvent) { e.Key = "usage-log:1 :input" }},
		{"key with surrounding whitespace", func(e *stripeclient.MeterEvent) { e.Key = " usage-log:1:input" }},
		{"key longer than an identifier may be", func(e *stripeclient.MeterEvent) { e.Key = strings.Repeat("k", 101) }},
		{"no event name", func(e *stripeclient.MeterEvent) { e.EventName = "" }},
		{"no customer", func(e *stripeclient.MeterEvent) { e.CustomerID = "" }},
		{"zero value", func(e *stripeclient.MeterEvent) { e.Value = 0 }},
		{"no timestamp", func(e *stripeclient.MeterEvent) { e.Timestamp = time.Time{} }},
	} {
		ev := event("cus_1", "usage-log:6:input")
		tc.mutate(&ev)
		_, err := client.SendMeterEvent(context.Background(), ev)
		if !stripeclient.IsPermanent(err) {
			t.Errorf("%s: got %v, want a permanent error", tc.name, err)
		}
	}
	if n := len(emu.Requests()); n != 0 {
		t.Errorf("%d requests reached the emulator, want none", n)
	}
}

func TestPermanentFailureKeepsStripesMessage(t *testing.T) {
	t.Parallel()
	_, base := startEmulator(t, emulator.Options{FailCustomers: map[string]string{"cus_gone": "No such customer: 'cus_gone'"}})
	client := newClient(t, stripeclient.Config{APIBase: base})
	_, err := client.SendMeterEvent(context.Background(), event("cus_gone", "usage-log:7:input"))
	var se *stripeclient.Error
	if !errors.As(err, &se) || se.Kind != stripeclient.KindPermanent || se.HTTPStatus != 400 ||
		se.Message != "No such customer: 'cus_gone'" || !strings.HasPrefix(se.RequestID, "req_") {
		t.Fatalf("got %#v", err)
	}
}

// Stripe allows one concurrent call per customer and meter; the keyed lock
// must serialise them so that none is refused.
func TestKeyedLockAvoidsConcurrencyRateLimit(t *testing.T) {
	t.Parallel()
	// Latency widens each call so that unserialised calls would overlap.
	emu, base := startEmulator(t, emulator.Options{Faults: emulator.Faults{Latency: 5 * time.Millisecond}})
	client := newClient(t, stripeclient.Config{APIBase: base})

	const n = 30
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := client.SendMeterEvent(context.Background(), event("cus_hot", fmt.Sprintf("usage-log:lock-%d:input", i)))
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("send: %v", err)
		}
	}
	for _, r := range emu.Requests() {
		if r.Status == http.StatusTooManyRequests {
			t.Errorf("request %s got 429 (%s)", r.IdempotencyKey, r.Outcome)
		}
	}
	if got := emu.Applied()[emulator.AppliedKey{Customer: "cus_hot", EventName: "llm_input_tokens"}]; got != n*250 {
		t.Errorf("applied %d, want %d", got, n*250)
	}
}

// The control for the test above: the same load without our lock is refused
// by the emulator, so the zero 429s there are the lock's doing.
func TestWithoutTheLockTheEmulatorRefusesConcurrentCalls(t *testing.T) {
	t.Parallel()
	emu, base := startEmulator(t, emulator.Options{Faults: emulator.Faults{Latency: 50 * time.Millisecond}})
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(base), LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}, MaxNetworkRetries: stripe.Int64(0),
	})
	raw := meterevent.Client{B: backend, Key: secretKey}
	const n = 8
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			p := &stripe.BillingMeterEventParams{
				EventName: stripe.String("llm_input_tokens"), Identifier: stripe.String(fmt.Sprintf("raw-%d", i)),
				Timestamp: stripe.Int64(time.Now().Unix()),
				Payload:   map[string]string{"stripe_customer_id": "cus_hot", "value": "1"},
			}
			p.IdempotencyKey = p.Identifier
			_, _ = raw.New(p)
		}()
	}
	close(start)
	wg.Wait()
	limited := 0
	for _, r := range emu.Requests() {
		if r.Outcome == emulator.OutcomeConcurrentRateLimit {
			limited++
		}
	}
	if limited == 0 {
		t.Errorf("%d simultaneous calls for one customer and meter, none refused with 429", n)
	}
}

// One customer whose calls hang must not hold every caller: once its call
// in flight is slow, a call beyond the queue limit is refused, unsent, while
// other customers' calls go through.
func TestCallsQueuedBehindOneCustomerAreBounded(t *testing.T) {
	t.Parallel()
	emu, base := startEmulator(t, emulator.Options{Faults: emulator.Faults{BlackholeCustomers: []string{"cus_stuck"}}})
	client := newClient(t, stripeclient.Config{APIBase: base, MaxQueuedPerMeter: 2, SlowCallAfter: 100 * time.Millisecond})

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	errs := make(chan error, 4)
	for i := range 4 { // one in flight, three queued while it is still fast
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := client.SendMeterEvent(ctx, event("cus_stuck", fmt.Sprintf("usage-log:stuck-%d:input", i)))
			errs <- err
		}()
	}
	// Once the call in flight is slow, one queued call too many gives up.
	var err error
	select {
	case err = <-errs:
	case <-time.After(10 * time.Second):
		t.Fatal("no queued call gave up behind a call hanging for 10 s")
	}
	var se *stripeclient.Error
	if !stripeclient.IsBusy(err) || !errors.As(err, &se) || !stripeclient.IsRetryable(err) || se.RetryAfter < time.Second {
		t.Fatalf("queued call behind a slow one: %v, want a retryable busy refusal with a RetryAfter of at least 1 s", err)
	}
	// A newcomer is refused at once.
	if _, err := client.SendMeterEvent(ctx, event("cus_stuck", "usage-log:stuck-extra:input")); !stripeclient.IsBusy(err) {
		t.Fatalf("newcomer behind a slow call and a full line: %v, want a busy refusal", err)
	}
	if _, err := client.SendMeterEvent(context.Background(), event("cus_other", "usage-log:other:input")); err != nil {
		t.Fatalf("another customer's call: %v", err)
	}
	var sent int
	for _, r := range emu.Requests() {
		if r.Customer == "cus_stuck" {
			sent++
		}
	}
	if sent != 1 {
		t.Fatalf("%d calls for the hanging customer reached Stripe, want only the one in flight", sent)
	}
}

func TestRateLimiterIsHonoured(t *testing.T) {
	t.Parallel()
	emu, base := startEmulator(t, emulator.Options{})
	client := newClient(t, stripeclient.Config{APIBase: base, RateLimit: 20, Burst: 1})

	begin := time.Now()
	const n = 6
	for i := range n {
		// Distinct customers, so only the rate limiter can space them out.
		if _, err := client.SendMeterEvent(context.Background(), event(fmt.Sprintf("cus_rl%d", i), fmt.Sprintf("usage-log:rl-%d:input", i))); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	// 20/s with a burst of 1: the first call is free, each next one waits
	// 50ms. The bound is loose for slow machines, never tight.
	if elapsed := time.Since(begin); elapsed < (n-1)*50*time.Millisecond*8/10 {
		t.Errorf("%d calls at 20/s took %v", n, elapsed)
	}
	if got := len(emu.Requests()); got != n {
		t.Errorf("%d requests, want %d", got, n)
	}

	slow := newClient(t, stripeclient.Config{APIBase: base, RateLimit: 0.001, Burst: 1})
	if _, err := slow.SendMeterEvent(context.Background(), event("cus_rlx", "usage-log:rl-x:input")); err != nil {
		t.Fatalf("first call within the burst: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := slow.SendMeterEvent(ctx, event("cus_rly", "usage-log:rl-y:input"))
	if !stripeclient.IsRetryable(err) {
		t.Errorf("waiting past the deadline: got %v, want a retryable error", err)
	}
	if got := len(emu.Requests()); got != n+1 {
		t.Errorf("%d requests, want %d: the throttled call must not be sent", got, n+1)
	}
}

func TestWaitingForTheCustomerLockHonoursContext(t *testing.T) {
	t.Parallel()
	emu, base := startEmulator(t, emulator.Options{Faults: emulator.Faults{BlackholeCustomers: []string{"cus_stuck"}}})
	client := newClient(t, stripeclient.Config{APIBase: base})

	holdCtx, release := context.WithCancel(context.Background())
	held := make(chan error, 1)
	go func() {
		_, err := client.SendMeterEvent(holdCtx, event("cus_stuck", "usage-log:8:input"))
		held <- err
	}()
	polltest.Until(t, "the first call to reach the emulator", 10*time.Second, func() bool { return len(emu.Requests()) == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := client.SendMeterEvent(ctx, event("cus_stuck", "usage-log:9:input"))
	if !stripeclient.IsRetryable(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second call for the same customer and meter: got %v, want a retryable deadline error", err)
	}
	if got := len(emu.Requests()); got != 1 {
		t.Errorf("%d requests reached the emulator, want 1", got)
	}

	release()
	if err := <-held; !stripeclient.IsRetryable(err) {
		t.Errorf("black-holed call: got %v, want retryable", err)
	}
	if n := emu.AppliedCount("usage-log:8:input"); n != 0 {
		t.Errorf("AppliedCount %d, want 0", n)
	}
	// The lock is free again.
	emu.SetFaults(emulator.Faults{})
	if _, err := client.SendMeterEvent(context.Background(), event("cus_stuck", "usage-log:9:input")); err != nil {
		t.Errorf("after release: %v", err)
	}
}

func TestSecretKeyIsNeverLogged(t *testing.T) {
	t.Parallel()
	var buf syncbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))

	// An emulator that does not know our key answers 401, the answer most
	// likely to mention a key.
	_, strictBase := startEmulator(t, emulator.Options{APIKeys: []string{"sk_test_someone_else"}})
	_, base := startEmulator(t, emulator.Options{FailCustomers: map[string]string{"cus_bad": "bad customer"}})

	cfg := stripeclient.Config{SecretKey: secretKey, APIBase: base, Logger: logger}
	client := newClient(t, cfg)
	var errs []error
	_, err := client.SendMeterEvent(context.Background(), event("cus_ok", "usage-log:10:input"))
	errs = append(errs, err)
	_, err = client.SendMeterEvent(context.Background(), event("cus_bad", "usage-log:11:input"))
	errs = append(errs, err)
	cfg.APIBase = strictBase
	_, err = newClient(t, cfg).SendMeterEvent(context.Background(), event("cus_ok", "usage-log:12:input"))
	errs = append(errs, err)
	cfg.APIBase = "http://127.0.0.1:1" // nothing listens there
	_, err = newClient(t, cfg).SendMeterEvent(context.Background(), event("cus_ok", "usage-log:13:input"))
	errs = append(errs, err)

	logger.Info("config", "cfg", cfg, "client", client)
	texts := []string{
		buf.String(),
		fmt.Sprintf("%v %+v %#v %s", cfg, cfg, cfg, cfg),
		fmt.Sprintf("%v %+v %#v %s", client, client, client, client),
		fmt.Sprintf("%v %+v %#v", *client, *client, *client),
	}
	for _, err := range errs {
		if err != nil {
			texts = append(texts, err.Error(), fmt.Sprintf("%+v %#v", err, err))
		}
	}
	for _, s := range texts {
		if strings.Contains(s, secretKey) {
			t.Errorf("secret key leaked in: %s", s)
		}
	}
	if !strings.Contains(buf.String(), "stripe-go") {
		t.Errorf("stripe-go's own log lines did not reach the logger, so the check above proves little:\n%s", buf.String())
	}
}

// STRIPE_API_BASE is typed by people; a trailing slash must not change
// where the request goes.
func TestAPIBaseWithTrailingSlash(t *testing.T) {
	t.Parallel()
	emu, base := startEmulator(t, emulator.Options{})
	u, _ := url.Parse(base + "/")
	client := newClient(t, stripeclient.Config{APIBase: u.String()})
	if _, err := client.SendMeterEvent(context.Background(), event("cus_1", "usage-log:14:input")); err != nil {
		t.Fatalf("send: %v", err)
	}
	if n := emu.AppliedCount("usage-log:14:input"); n != 1 {
		t.Errorf("AppliedCount %d", n)
	}
}
