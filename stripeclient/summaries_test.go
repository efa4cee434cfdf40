package stripeclient_test

import (
	"bytes"
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

	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/stripeclient/stripeclienttest"
)

// srSecretKey is distinctive so a leak is found by a substring search.
const srSecretKey = "sk_test_51ReAdErSeCrEtKeyNeverLogged0077"

func srReader(t *testing.T, cfg stripeclient.Config) *stripeclient.SummaryClient {
	t.Helper()
	if cfg.SecretKey == "" {
		cfg.SecretKey = srSecretKey
	}
	if cfg.RateLimit == 0 {
		cfg.RateLimit = 10000
	}
	r, err := stripeclient.NewSummaryReader(cfg)
	if err != nil {
		t.Fatalf("NewSummaryReader: %v", err)
	}
	return r
}

// srWire records the requests that really went out, and can fail the
// first few of them with a network error before they leave.
type srWire struct {
	mu       sync.Mutex
	urls     []*url.URL
	failNext int
}

func (w *srWire) RoundTrip(req *http.Request) (*http.Response, error) {
	w.mu.Lock()
	fail := w.failNext > 0
	if fail {
		w.failNext--
	} else {
		w.urls = append(w.urls, req.URL)
	}
	w.mu.Unlock()
	if fail {
		return nil, errors.New("srWire: connection reset (injected)")
	}
	return http.DefaultTransport.RoundTrip(req)
}

func (w *srWire) sent() []*url.URL {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*url.URL(nil), w.urls...)
}

// stripe-mock checks requests against Stripe's OpenAPI schema: the list
// requests the reader makes must be ones Stripe accepts.
func TestSummaryReaderRequestsAreAcceptedByStripeMock(t *testing.T) {
	t.Parallel()
	base := stripeclienttest.StartStripeMock(t)
	wire := &srWire{}
	r := srReader(t, stripeclient.Config{SecretKey: stripeclienttest.StripeMockKey, APIBase: base, HTTPClient: &http.Client{Transport: wire}})
	ctx := context.Background()

	meters, err := r.Meters(ctx)
	if err != nil {
		t.Fatalf("Meters: %v", err)
	}
	if len(meters) == 0 || meters[0].ID == "" || meters[0].EventName == "" || meters[0].Formula != "sum" {
		t.Fatalf("meters %+v", meters)
	}
	day := time.Now().UTC().Truncate(24 * time.Hour)
	sums, err := r.DailySummaries(ctx, meters[0].ID, "cus_123", day.Add(-48*time.Hour), day.Add(24*time.Hour))
	if err != nil {
		t.Fatalf("DailySummaries: %v", err)
	}
	if len(sums) == 0 {
		t.Fatalf("no summaries from stripe-mock's fixture")
	}

	sent := wire.sent()
	if len(sent) != 2 {
		t.Fatalf("%d requests, want 2: %v", len(sent), sent)
	}
	if sent[0].Path != "/v1/billing/meters" || sent[0].Query().Encode() != "limit=100" {
		t.Errorf("meters request %s", sent[0])
	}
	want := url.Values{
		"customer":              {"cus_123"},
		"start_time":            {fmt.Sprint(day.Add(-48 * time.Hour).Unix())},
		"end_time":              {fmt.Sprint(day.Add(24 * time.Hour).Unix())},
		"value_grouping_window": {"day"},
		"limit":                 {"100"},
	}
	if sent[1].Path != "/v1/billing/meters/"+meters[0].ID+"/event_summaries" || sent[1].Query().Encode() != want.Encode() {
		t.Errorf("summaries request %s, want query %s", sent[1], want.Encode())
	}

	// stripe-mock does check query strings, so the acceptance above means
	// something: the same request with a grouping Stripe does not know, or
	// without the customer, is refused.
	for _, mutate := range []func(url.Values){
		func(v url.Values) { v.Set("value_grouping_window", "week") },
		func(v url.Values) { v.Del("customer") },
	} {
		q := url.Values{}
		for k, v := range want {
			q[k] = append([]string(nil), v...)
		}
		mutate(q)
		req, err := http.NewRequest(http.MethodGet, base+sent[1].Path+"?"+q.Encode(), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+stripeclienttest.StripeMockKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("query %s: status %d, want 400", q.Encode(), resp.StatusCode)
		}
	}
}

func TestSummaryReaderPaginatesAndSumsPerDay(t *testing.T) {
	t.Parallel()
	emu, base := startEmulator(t, emulator.Options{Meters: []string{"llm_cached_tokens"}})
	sender, err := stripeclient.New(stripeclient.Config{SecretKey: srSecretKey, APIBase: base, RateLimit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	n := 0
	send := func(customer, eventName string, ts time.Time, value int64) {
		t.Helper()
		n++
		if _, err := sender.SendMeterEvent(context.Background(), stripeclient.MeterEvent{
			EventName: eventName, CustomerID: customer, Value: value, Timestamp: ts, Key: fmt.Sprintf("sr-%d", n),
		}); err != nil {
			t.Fatal(err)
		}
	}
	send("cus_a", "llm_input_tokens", today.Add(-48*time.Hour), 5)             // first second of day -2
	send("cus_a", "llm_input_tokens", today.Add(-24*time.Hour-time.Second), 6) // last second of day -2
	send("cus_a", "llm_input_tokens", today, 7)                                // first second of today
	send("cus_b", "llm_input_tokens", today.Add(-24*time.Hour), 1000)          // another customer
	send("cus_a", "llm_output_tokens", today.Add(-24*time.Hour), 9)            // another meter

	r := srReader(t, stripeclient.Config{APIBase: base}).WithPageSize(1)
	ctx := context.Background()
	meters, err := r.Meters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, m := range meters {
		if m.Status != "active" || m.Formula != "sum" || m.CustomerPayloadKey != "stripe_customer_id" || m.ValuePayloadKey != "value" {
			t.Errorf("meter %+v", m)
		}
		ids[m.EventName] = m.ID
	}
	if len(meters) != 3 || ids["llm_input_tokens"] != emu.MeterID("llm_input_tokens") || ids["llm_cached_tokens"] == "" {
		t.Fatalf("meters %+v", meters)
	}

	before := len(emu.Requests())
	sums, err := r.DailySummaries(ctx, ids["llm_input_tokens"], "cus_a", today.Add(-48*time.Hour), today.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, s := range sums {
		if s.End.Sub(s.Start) != 24*time.Hour || s.Start.Location() != time.UTC {
			t.Errorf("window %v .. %v", s.Start, s.End)
		}
		got[s.Start.Format("2006-01-02")] = s.Value
	}
	want := map[string]float64{
		today.Add(-48 * time.Hour).Format("2006-01-02"): 11,
		today.Add(-24 * time.Hour).Format("2006-01-02"): 0,
		today.Format("2006-01-02"):                      7,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("daily summaries %v, want %v", got, want)
	}
	if pages := len(emu.Requests()) - before; pages != 3 {
		t.Errorf("%d requests for 3 windows at page size 1, want 3 pages", pages)
	}
}

func TestSummaryReaderRefusesMisalignedWindowsWithoutSending(t *testing.T) {
	t.Parallel()
	emu, base := startEmulator(t, emulator.Options{})
	r := srReader(t, stripeclient.Config{APIBase: base})
	day := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	paris := time.FixedZone("CET", 3600)
	for name, c := range map[string]struct {
		meter, customer string
		start, end      time.Time
	}{
		"start mid-day":              {"mtr_1", "cus_a", day.Add(time.Hour), day.Add(24 * time.Hour)},
		"end mid-day":                {"mtr_1", "cus_a", day, day.Add(25 * time.Hour)},
		"local midnight":             {"mtr_1", "cus_a", time.Date(2026, 11, 29, 0, 0, 0, 0, paris), day.Add(24 * time.Hour)},
		"empty window":               {"mtr_1", "cus_a", day, day},
		"start after end":            {"mtr_1", "cus_a", day.Add(24 * time.Hour), day},
		"no meter":                   {"", "cus_a", day, day.Add(24 * time.Hour)},
		"no customer":                {"mtr_1", "", day, day.Add(24 * time.Hour)},
		"zero start and end":         {"mtr_1", "cus_a", time.Time{}, time.Time{}},
		"a nanosecond past midnight": {"mtr_1", "cus_a", day.In(paris).Add(time.Nanosecond), day.Add(24 * time.Hour)},
	} {
		_, err := r.DailySummaries(context.Background(), c.meter, c.customer, c.start, c.end)
		if !stripeclient.IsPermanent(err) {
			t.Errorf("%s: got %v, want a permanent error", name, err)
		}
	}
	if n := len(emu.Requests()); n != 0 {
		t.Errorf("%d requests reached Stripe", n)
	}
	// A midnight UTC given in another zone is the same instant: accepted.
	if _, err := r.DailySummaries(context.Background(), emu.MeterID("llm_input_tokens"), "cus_a", day.In(paris), day.Add(24*time.Hour)); err != nil {
		t.Errorf("UTC midnight in another zone: %v", err)
	}
}

func TestSummaryReaderErrors(t *testing.T) {
	t.Parallel()
	var logs srBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	emu, base := startEmulator(t, emulator.Options{})
	day := time.Now().UTC().Truncate(24 * time.Hour)
	ctx := context.Background()
	var texts []string

	// Stripe's 404 for an unknown meter is permanent and says what failed.
	r := srReader(t, stripeclient.Config{APIBase: base, Logger: logger})
	_, err := r.DailySummaries(ctx, "mtr_nope", "cus_a", day, day.Add(24*time.Hour))
	var se *stripeclient.Error
	if !errors.As(err, &se) || se.Kind != stripeclient.KindPermanent || se.HTTPStatus != 404 || se.RequestID == "" ||
		!strings.Contains(se.Error(), "listing event summaries of meter mtr_nope for customer cus_a") {
		t.Errorf("unknown meter: %v", err)
	}
	texts = append(texts, fmt.Sprintf("%v %+v", err, err))

	// A network error is retried: the listing starts again and succeeds.
	wire := &srWire{failNext: 2}
	r = srReader(t, stripeclient.Config{APIBase: base, Logger: logger, HTTPClient: &http.Client{Transport: wire}})
	if _, err := r.Meters(ctx); err != nil {
		t.Errorf("after two lost connections: %v", err)
	}
	if n := len(wire.sent()); n != 1 {
		t.Errorf("%d requests reached the emulator, want 1", n)
	}

	// ... but not forever.
	wire = &srWire{failNext: 100}
	r = srReader(t, stripeclient.Config{APIBase: base, Logger: logger, HTTPClient: &http.Client{Transport: wire}})
	_, err = r.Meters(ctx)
	if !stripeclient.IsRetryable(err) || wire.failNext != 100-3 {
		t.Errorf("always failing: %v after %d attempts, want a retryable error after 3", err, 100-wire.failNext)
	}
	texts = append(texts, fmt.Sprintf("%v %+v", err, err))

	// A cancelled context stops the retries.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.Meters(cctx); err == nil {
		t.Errorf("cancelled context: no error")
	}

	// A key the account does not know: 401, permanent, key not echoed.
	_, strict := startEmulator(t, emulator.Options{APIKeys: []string{"sk_test_someone_else"}})
	r = srReader(t, stripeclient.Config{APIBase: strict, Logger: logger})
	_, err = r.Meters(ctx)
	if !errors.As(err, &se) || se.Kind != stripeclient.KindPermanent || se.HTTPStatus != 401 {
		t.Errorf("unknown key: %v", err)
	}
	texts = append(texts, fmt.Sprintf("%v %+v", err, err))

	logger.Info("reader", "reader", r)
	texts = append(texts, logs.String(), fmt.Sprintf("%v %+v %#v %s", r, r, r, r), fmt.Sprintf("%v %+v %#v", *r, *r, *r))
	for _, s := range texts {
		if strings.Contains(s, srSecretKey) {
			t.Errorf("secret key leaked in: %s", s)
		}
	}
	if !strings.Contains(logs.String(), "stripe-go") {
		t.Errorf("stripe-go's log lines did not reach the logger:\n%s", logs.String())
	}
	_ = emu

	if _, err := stripeclient.NewSummaryReader(stripeclient.Config{SecretKey: "pk_test_51ReAdEr"}); err == nil {
		t.Errorf("publishable key accepted")
	}
	if _, err := stripeclient.NewSummaryReader(stripeclient.Config{SecretKey: srSecretKey, APIBase: "localhost:1"}); err == nil {
		t.Errorf("relative API base accepted")
	}
}

type srBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *srBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *srBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
