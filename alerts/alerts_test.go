package alerts_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/overage-billing/overage/alerts"
	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/tenants"
)

// world is a migrated database, the real ingest service and a tenant.
type world struct {
	pool   *pgxpool.Pool
	svc    *ingest.Service
	river  *river.Client[pgx.Tx]
	tenant uuid.UUID
	key    string
	secret string
}

type worldOpts struct {
	in, out int64 // allowance
	alertAt []int
	url     string
	deliver *alerts.DeliverConfig // non-nil: run the delivery workers
}

func newWorld(t *testing.T, o worldOpts) *world { return newWorldTB(t, o) }

func newWorldTB(t testing.TB, o worldOpts) *world {
	t.Helper()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	w := &world{pool: pool}
	cfg := &river.Config{}
	if o.deliver != nil {
		ws := river.NewWorkers()
		river.AddWorker(ws, alerts.NewDeliverer(pool, *o.deliver))
		cfg = &river.Config{Workers: ws, Queues: map[string]river.QueueConfig{alerts.QueueAlerts: {MaxWorkers: 5}},
			FetchCooldown: 5 * time.Millisecond, FetchPollInterval: 20 * time.Millisecond}
	}
	rc, err := river.NewClient(riverpgxv5.New(pool), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if o.deliver != nil {
		if err := rc.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = rc.StopAndCancel(sctx)
		})
	}
	w.river = rc
	w.svc = app.NewIngest(pool, rc, &app.IngestConfig{Report: app.ReportConfig{MaxAttempts: 5, BatchDelay: time.Second}, Coalesce: ingest.DefaultGroupsInFlight})
	w.addTenant(t, o)
	return w
}

// another is w with another tenant, in the same database and services.
func (w *world) another(t *testing.T, o worldOpts) *world { return w.anotherTB(t, o) }

func (w *world) anotherTB(t testing.TB, o worldOpts) *world {
	t.Helper()
	w2 := *w
	w2.addTenant(t, o)
	return &w2
}

func (w *world) addTenant(t testing.TB, o worldOpts) {
	t.Helper()
	ctx := context.Background()
	store := tenants.NewStore(w.pool)
	c, err := store.Create(ctx, tenants.CreateParams{Name: "t", StripeCustomerID: "cus_alerts", IncludedInputTokens: o.in, IncludedOutputTokens: o.out})
	if err != nil {
		t.Fatal(err)
	}
	w.tenant, w.key, w.secret = c.ID, c.APIKey, ""
	p := tenants.UpdateParams{}
	if o.alertAt != nil {
		p.AlertAt = &o.alertAt
	}
	if o.url != "" {
		p.AlertURL = &o.url
	}
	if p.AlertAt != nil || p.AlertURL != nil {
		d, err := store.Update(ctx, c.ID, p)
		if err != nil {
			t.Fatal(err)
		}
		w.secret = d.AlertSecret
		if o.url != "" && !strings.HasPrefix(w.secret, "whsec_") {
			t.Fatalf("setting the URL answered secret %q", w.secret)
		}
	}
}

var seq atomic.Int64

func rid() *string {
	s := fmt.Sprintf("r%d-%s", seq.Add(1), uuid.NewString()[:8])
	return &s
}

func (w *world) single(t *testing.T, ts time.Time, in, out int64) uuid.UUID {
	t.Helper()
	key := uuid.NewString()
	o, err := w.svc.Record(context.Background(), ingest.RecordParams{TenantID: w.tenant, Key: key, Fingerprint: []byte(key),
		Event: &ingest.Event{RequestID: rid(), Timestamp: ts.UTC().Truncate(time.Microsecond), UserID: "u", ModelID: "m", InputTokens: in, OutputTokens: out}})
	if err != nil {
		t.Fatal(err)
	}
	return o.UsageLogID
}

func (w *world) batch(ctx context.Context, n int, in, out int64) error {
	key := uuid.NewString()
	evs := make([]*ingest.Event, n)
	for i := range evs {
		evs[i] = &ingest.Event{RequestID: rid(), Timestamp: time.Now().UTC().Truncate(time.Microsecond), UserID: "u", ModelID: "m", InputTokens: in, OutputTokens: out}
	}
	_, err := w.svc.RecordBatch(ctx, ingest.BatchParams{TenantID: w.tenant, Key: key, Fingerprint: []byte(key), Events: evs})
	return err
}

func (w *world) correct(t *testing.T, id uuid.UUID, in, out int64) {
	t.Helper()
	key := uuid.NewString()
	if _, err := w.svc.Correct(context.Background(), ingest.CorrectParams{UsageLogID: id, Key: key, Fingerprint: []byte(key),
		InputTokens: in, OutputTokens: out, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
}

type eventRow struct {
	meter  string
	period time.Time
	pct    int
	used   int64
}

func (w *world) events(t *testing.T) []eventRow {
	t.Helper()
	rows, err := w.pool.Query(context.Background(), `SELECT meter, period_start, threshold_percent, used FROM alert_events
		WHERE tenant_id = $1 ORDER BY period_start, meter, threshold_percent`, w.tenant)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (eventRow, error) {
		var e eventRow
		err := r.Scan(&e.meter, &e.period, &e.pct, &e.used)
		return e, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (w *world) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := w.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// 50 concurrent batches take the input meter across 80% and 100%: exactly
// two events, each with one delivery job, and the output meter, which
// stays below 80%, none.
func TestConcurrentBatchesCrossEachThresholdOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t, worldOpts{in: 1000, out: 1000, alertAt: []int{80, 100}, url: "http://127.0.0.1:1/unused"})
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// 50 × 2 × 12 = 1,200 input tokens; 200 output tokens.
			if err := w.batch(context.Background(), 2, 12, 2); err != nil {
				errs <- fmt.Errorf("batch %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	ev := w.events(t)
	if len(ev) != 2 || ev[0].meter != "input" || ev[0].pct != 80 || ev[1].meter != "input" || ev[1].pct != 100 {
		t.Fatalf("events %+v, want input at 80 and at 100", ev)
	}
	if ev[0].used < 800 || ev[0].used >= 1000 || ev[1].used < 1000 {
		t.Errorf("used at crossing %+v", ev)
	}
	if n := w.count(t, `SELECT count(*) FROM river_job WHERE kind = 'overage.deliver_alert'`); n != 2 {
		t.Errorf("%d delivery jobs, want 2", n)
	}
}

// A correction back below 80% and usage that crosses 80% again record no
// second event; a correction that crosses upward counts like usage.
func TestCorrectionBelowAndCrossingAgainRecordsNoSecondEvent(t *testing.T) {
	t.Parallel()
	w := newWorld(t, worldOpts{in: 1000, out: 1000, alertAt: []int{50, 80, 100}})
	now := time.Now()
	first := w.single(t, now, 850, 1) // crosses 50 and 80
	if ev := w.events(t); len(ev) != 2 {
		t.Fatalf("after 850 of 1000: events %+v, want 50 and 80", ev)
	}
	w.correct(t, first, 100, 1) // back to 100: below both
	w.single(t, now, 800, 1)    // 900: across 50 and 80 again
	if ev := w.events(t); len(ev) != 2 {
		t.Fatalf("after crossing again: events %+v, want still two", ev)
	}
	w.correct(t, first, 250, 1) // 1,050: a correction that crosses 100
	ev := w.events(t)
	if len(ev) != 3 || ev[2].pct != 100 || ev[2].used != 1050 {
		t.Fatalf("after the upward correction: events %+v, want 100 at 1050", ev)
	}
}

// Streaming checkpoints cross like any usage.
func TestCheckpointsCross(t *testing.T) {
	t.Parallel()
	w := newWorld(t, worldOpts{in: 100, out: 100, alertAt: []int{80}})
	r := *rid()
	for i, total := range []int64{50, 79, 81, 90} {
		key := fmt.Sprintf("%s:%d", r, i)
		if _, err := w.svc.Checkpoint(context.Background(), ingest.RecordParams{TenantID: w.tenant, Key: key, Fingerprint: []byte(key),
			Event: &ingest.Event{RequestID: &r, Timestamp: time.Now().UTC().Truncate(time.Microsecond), UserID: "u", ModelID: "m",
				InputTokens: total, OutputTokens: 1, Stream: &ingest.Checkpoint{Sequence: int64(i)}}}); err != nil {
			t.Fatal(err)
		}
	}
	if ev := w.events(t); len(ev) != 1 || ev[0].used != 81 {
		t.Fatalf("events %+v, want one at 81", ev)
	}
}

// A new period starts over: the same thresholds fire again in it.
func TestNewPeriodStartsOver(t *testing.T) {
	t.Parallel()
	w := newWorld(t, worldOpts{in: 100, out: 100, alertAt: []int{80}})
	now := time.Now().UTC()
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	w.single(t, month.Add(-time.Hour), 90, 1) // the previous month
	w.single(t, now, 85, 1)
	ev := w.events(t)
	if len(ev) != 2 || !ev[0].period.Equal(month.AddDate(0, -1, 0)) || !ev[1].period.Equal(month) {
		t.Fatalf("events %+v, want one in each of the periods starting %s and %s", ev, month.AddDate(0, -1, 0), month)
	}
}

// Usage that crosses nothing costs no database work in Record: it is
// given no transaction at all here.
func TestRecordWithoutCrossingTouchesNoDatabase(t *testing.T) {
	r := alerts.NewRecorder(nil)
	p := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for _, u := range []alerts.Usage{
		{Meter: "input", PeriodStart: p, Included: 0, Before: 0, After: 50},       // no allowance
		{Meter: "input", PeriodStart: p, Included: 100, Before: 100, After: 150},  // past the allowance
		{Meter: "output", PeriodStart: p, Included: 100, Before: 90, After: 80},   // a correction down
		{Meter: "output", PeriodStart: p, Included: 100, Before: 120, After: 120}, // no change
	} {
		if err := r.Record(context.Background(), nil, uuid.New(), u); err != nil {
			t.Fatalf("%+v: %v", u, err)
		}
	}
	var nilRec *alerts.Recorder
	if err := nilRec.Record(context.Background(), nil, uuid.New(), alerts.Usage{Included: 10, After: 10}); err != nil {
		t.Fatal(err)
	}
}

func TestLevel(t *testing.T) {
	for _, c := range []struct {
		included int64
		pct      int
		want     int64
	}{{1000, 80, 800}, {3, 50, 2}, {1, 1, 1}, {9223372036854775807, 100, 9223372036854775807}, {9223372036854775807, 80, 7378697629483820646}} {
		if got := alerts.Level(c.included, c.pct); got != c.want {
			t.Errorf("Level(%d, %d) = %d, want %d", c.included, c.pct, got, c.want)
		}
	}
}

// receiver is an endpoint that answers from a script and records what it
// got.
type receiver struct {
	mu       sync.Mutex
	got      []delivery
	answer   func(n int, r *http.Request) int
	received chan struct{}
}

type delivery struct {
	id, sig string
	body    []byte
	at      time.Time
}

func (rv *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rv.mu.Lock()
	rv.got = append(rv.got, delivery{id: r.Header.Get("Overage-Event-Id"), sig: r.Header.Get("Overage-Signature"), body: body, at: time.Now()})
	n := len(rv.got)
	rv.mu.Unlock()
	w.WriteHeader(rv.answer(n, r))
}

func (rv *receiver) deliveries() []delivery {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	return append([]delivery(nil), rv.got...)
}

func fastDelivery() *alerts.DeliverConfig {
	return &alerts.DeliverConfig{Timeout: 2 * time.Second, BaseBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
}

// A receiver that answers 500 twice, then 200, gets three deliveries of
// the one event, each with its id and a valid signature of its body.
func TestDeliveryRetriesUntil2xx(t *testing.T) {
	t.Parallel()
	rv := &receiver{answer: func(n int, _ *http.Request) int {
		if n <= 2 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	}}
	srv := httptest.NewServer(rv)
	defer srv.Close()
	w := newWorld(t, worldOpts{in: 100, out: 100, alertAt: []int{80}, url: srv.URL + "/hook", deliver: fastDelivery()})
	w.single(t, time.Now(), 90, 1)
	polltest.Until(t, "the event delivered", 20*time.Second, func() bool {
		return w.count(t, `SELECT count(*) FROM alert_events WHERE tenant_id = $1 AND delivery_status = 'delivered'`, w.tenant) == 1
	})
	got := rv.deliveries()
	if len(got) != 3 {
		t.Fatalf("%d deliveries, want 3", len(got))
	}
	for i, d := range got {
		if d.id != got[0].id || !strings.HasPrefix(d.id, "evt_") {
			t.Errorf("delivery %d has event id %q, the first %q", i, d.id, got[0].id)
		}
		if err := alerts.Verify(w.secret, d.sig, d.body, 5*time.Minute, time.Now()); err != nil {
			t.Errorf("delivery %d: signature %q does not verify: %v", i, d.sig, err)
		}
		var ev alerts.Event
		if err := json.Unmarshal(d.body, &ev); err != nil || ev.ID != d.id || ev.Type != "usage.threshold_crossed" ||
			ev.Data.ThresholdPercent != 80 || ev.Data.Used != 90 || ev.Data.Included != 100 || ev.Data.Meter != "input" || ev.Data.TenantID != w.tenant {
			t.Errorf("delivery %d body %s (%v)", i, d.body, err)
		}
		if string(d.body) != string(got[0].body) {
			t.Errorf("delivery %d body differs from the first", i)
		}
	}
	var outcomes string
	if err := w.pool.QueryRow(context.Background(), `SELECT string_agg(outcome || ':' || coalesce(status_code::text, '-'), ',' ORDER BY attempt)
		FROM alert_deliveries`).Scan(&outcomes); err != nil {
		t.Fatal(err)
	}
	if outcomes != "retry:500,retry:500,delivered:200" {
		t.Errorf("recorded attempts %s", outcomes)
	}
	// GET /v1/events shows it delivered.
	l, err := alerts.Events(context.Background(), w.pool, w.tenant, uuid.Nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Data) != 1 || l.Data[0].ID != got[0].id || l.Data[0].Delivery.Status != "delivered" || l.Data[0].Delivery.Attempts != 3 {
		t.Errorf("events list %+v", l)
	}
}

// A receiver that hangs is cut at the timeout and the event retried.
func TestHangingReceiverIsCutAtTheTimeoutAndRetried(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	rv := &receiver{answer: func(n int, r *http.Request) int {
		if n == 1 {
			select { // hang until the deliverer gives up
			case <-r.Context().Done():
			case <-release:
			}
		}
		return http.StatusNoContent
	}}
	srv := httptest.NewServer(rv)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	cfg := fastDelivery()
	cfg.Timeout = 300 * time.Millisecond
	w := newWorld(t, worldOpts{in: 100, out: 100, alertAt: []int{80}, url: srv.URL, deliver: cfg})
	w.single(t, time.Now(), 90, 1)
	polltest.Until(t, "the event delivered", 20*time.Second, func() bool {
		return w.count(t, `SELECT count(*) FROM alert_events WHERE tenant_id = $1 AND delivery_status = 'delivered'`, w.tenant) == 1
	})
	var took time.Duration
	var errText string
	if err := w.pool.QueryRow(context.Background(), `SELECT extract(epoch FROM finished_at - started_at) * interval '1 second', error
		FROM alert_deliveries WHERE attempt = 1`).Scan(&took, &errText); err != nil {
		t.Fatal(err)
	}
	if took < 300*time.Millisecond || took > 2*time.Second || !strings.Contains(strings.ToLower(errText), "timeout") && !strings.Contains(errText, "deadline") {
		t.Errorf("first attempt took %s with error %q; want cut at 300ms", took, errText)
	}
	if got := rv.deliveries(); len(got) != 2 || got[0].id != got[1].id {
		t.Errorf("deliveries %d, want 2 of one event", len(got))
	}
}

// Past the retry window a delivery is failed, and counted as such.
func TestDeliveryFailsAfterMaxAge(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(&receiver{answer: func(int, *http.Request) int { return http.StatusBadGateway }})
	defer srv.Close()
	cfg := fastDelivery()
	cfg.MaxAge = 300 * time.Millisecond
	w := newWorld(t, worldOpts{in: 100, out: 100, alertAt: []int{80}, url: srv.URL, deliver: cfg})
	w.single(t, time.Now(), 90, 1)
	polltest.Until(t, "the event failed", 20*time.Second, func() bool {
		return w.count(t, `SELECT count(*) FROM alert_events WHERE tenant_id = $1 AND delivery_status = 'failed'`, w.tenant) == 1
	})
	if n := w.count(t, `SELECT count(*) FROM alert_deliveries WHERE outcome = 'failed'`); n != 1 {
		t.Errorf("%d failed attempts recorded, want 1 (the last)", n)
	}
	// River records the job's end asynchronously: it is cancelled, not
	// left to retry.
	polltest.Until(t, "the delivery job cancelled", 10*time.Second, func() bool {
		return w.count(t, `SELECT count(*) FROM river_job WHERE kind = 'overage.deliver_alert' AND state = 'cancelled'`) == 1
	})
}

func TestTamperedBodyFailsVerification(t *testing.T) {
	body := []byte(`{"id":"evt_1","data":{"used":80500}}`)
	now := time.Now()
	sig := alerts.Sign("whsec_test", now, body)
	if err := alerts.Verify("whsec_test", sig, body, 5*time.Minute, now); err != nil {
		t.Fatalf("a genuine signature fails: %v", err)
	}
	tampered := []byte(strings.Replace(string(body), "80500", "1", 1))
	for name, c := range map[string]struct {
		secret, sig string
		body        []byte
		at          time.Time
	}{
		"tampered body": {"whsec_test", sig, tampered, now},
		"other secret":  {"whsec_other", sig, body, now},
		"too old":       {"whsec_test", sig, body, now.Add(10 * time.Minute)},
		"no v1":         {"whsec_test", "t=1", body, now},
		"garbage":       {"whsec_test", "nonsense", body, now},
	} {
		if err := alerts.Verify(c.secret, c.sig, c.body, 5*time.Minute, c.at); !errors.Is(err, alerts.ErrSignature) {
			t.Errorf("%s: Verify = %v, want ErrSignature", name, err)
		}
	}
}

func get(t *testing.T, h http.Handler, path, bearer string, v any) int {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if v != nil && rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, rec.Body)
		}
	}
	return rec.Code
}

const adminToken = "admin-token-of-at-least-thirty-two-characters"

func handler(w *world) http.Handler {
	r := chi.NewRouter()
	alerts.NewHandler(alerts.HandlerConfig{DB: w.pool, Auth: tenants.NewStore(w.pool), AdminToken: adminToken,
		EventNames: map[string]string{"input": "llm_input_tokens", "output": "llm_output_tokens"}}).Routes(r)
	return r
}

// GET /v1/usage, read from counters, equals the sums over the usage logs
// after singles, batches, checkpoints, corrections and billing, in the
// current period and in an earlier one.
func TestUsageEqualsTheSumOfTheLogs(t *testing.T) {
	t.Parallel()
	w := newWorld(t, worldOpts{in: 500, out: 300, alertAt: []int{80}})
	ctx := context.Background()
	now := time.Now().UTC()
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	var ids []uuid.UUID
	for i := range 10 {
		ids = append(ids, w.single(t, now, int64(40+i), int64(25+i)))
	}
	ids = append(ids, w.single(t, month.Add(-time.Minute), 700, 10)) // the previous month
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.batch(ctx, 7, 13, 9); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	r := *rid()
	for i, total := range []int64{30, 60, 45} {
		key := fmt.Sprintf("%s:%d", r, i)
		if _, err := w.svc.Checkpoint(ctx, ingest.RecordParams{TenantID: w.tenant, Key: key, Fingerprint: []byte(key),
			Event: &ingest.Event{RequestID: &r, Timestamp: now, UserID: "u", ModelID: "m", InputTokens: total, OutputTokens: total / 3,
				Stream: &ingest.Checkpoint{Sequence: int64(i), Final: i == 2}}}); err != nil {
			t.Fatal(err)
		}
	}
	w.correct(t, ids[0], 0, 0)
	w.correct(t, ids[3], 400, 100)
	// Bill some logs, as the report worker would.
	if _, err := w.pool.Exec(ctx, `UPDATE usage_logs SET billing_status = 'billed', billed_at = now()
		WHERE tenant_id = $1 AND billing_status = 'pending' AND id IN (SELECT id FROM usage_logs WHERE tenant_id = $1 ORDER BY id LIMIT 20)`, w.tenant); err != nil {
		t.Fatal(err)
	}
	h := handler(w)
	for _, period := range []time.Time{month, month.AddDate(0, -1, 0)} {
		var want [2]alerts.MeterUsage
		if err := w.pool.QueryRow(ctx, `SELECT coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0),
				coalesce(sum(coalesce(overage_input_tokens, input_tokens)), 0), coalesce(sum(coalesce(overage_output_tokens, output_tokens)), 0),
				coalesce(sum(coalesce(overage_input_tokens, input_tokens)) FILTER (WHERE billing_status = 'billed'), 0),
				coalesce(sum(coalesce(overage_output_tokens, output_tokens)) FILTER (WHERE billing_status = 'billed'), 0),
				coalesce(sum(coalesce(overage_input_tokens, input_tokens)) FILTER (WHERE billing_status = 'pending'), 0),
				coalesce(sum(coalesce(overage_output_tokens, output_tokens)) FILTER (WHERE billing_status = 'pending'), 0)
			FROM usage_logs WHERE tenant_id = $1 AND period_start = $2`, w.tenant, period).Scan(
			&want[0].Used, &want[1].Used, &want[0].Overage, &want[1].Overage, &want[0].Billed, &want[1].Billed, &want[0].Pending, &want[1].Pending); err != nil {
			t.Fatal(err)
		}
		want[0].Meter, want[0].EventName, want[0].Included = "input", "llm_input_tokens", 500
		want[1].Meter, want[1].EventName, want[1].Included = "output", "llm_output_tokens", 300
		for i := range want {
			want[i].Remaining = max(0, want[i].Included-want[i].Used)
		}
		if want[0].Used == 0 || want[0].Overage == 0 || want[0].Billed == 0 && period.Equal(month) {
			t.Fatalf("the scenario is too thin to test anything: %+v", want)
		}
		path := "/v1/usage"
		if !period.Equal(month) {
			path += "?period_start=" + period.Format(time.RFC3339)
		}
		var got alerts.PeriodUsage
		if code := get(t, h, path, w.key, &got); code != http.StatusOK {
			t.Fatalf("GET %s: %d", path, code)
		}
		if got.TenantID != w.tenant || !got.Period.Start.Equal(period) || !got.Period.End.Equal(period.AddDate(0, 1, 0)) {
			t.Errorf("GET %s: tenant %s period %+v", path, got.TenantID, got.Period)
		}
		if len(got.Meters) != 2 || got.Meters[0] != want[0] || got.Meters[1] != want[1] {
			t.Errorf("GET %s:\n got  %+v\n want %+v", path, got.Meters, want)
		}
		// The administrator reads the same with ?tenant_id=.
		var admin alerts.PeriodUsage
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		if code := get(t, h, path+sep+"tenant_id="+w.tenant.String(), adminToken, &admin); code != http.StatusOK || len(admin.Meters) != 2 || admin.Meters[0] != got.Meters[0] {
			t.Errorf("admin GET %s: %d %+v", path, code, admin)
		}
	}
	if code := get(t, h, "/v1/usage", "", nil); code != http.StatusUnauthorized {
		t.Errorf("no key: %d, want 401", code)
	}
	if code := get(t, h, "/v1/usage", adminToken, nil); code != http.StatusBadRequest {
		t.Errorf("admin without tenant_id: %d, want 400", code)
	}
}

// GET /v1/events pages newest first with ?starting_after=.
func TestEventsPages(t *testing.T) {
	t.Parallel()
	w := newWorld(t, worldOpts{in: 1000, out: 1000, alertAt: []int{10, 20, 30, 40, 50}})
	for range 5 {
		w.single(t, time.Now(), 100, 1) // one threshold a call
	}
	h := handler(w)
	var seen []string
	path := "/v1/events?limit=2"
	for page := 0; ; page++ {
		var l alerts.EventList
		if code := get(t, h, path, w.key, &l); code != http.StatusOK {
			t.Fatalf("GET %s: %d", path, code)
		}
		for _, e := range l.Data {
			seen = append(seen, fmt.Sprintf("%d:%s", e.Data.ThresholdPercent, e.Delivery.Status))
		}
		if !l.HasMore {
			break
		}
		if page > 5 || l.NextStartingAfter == nil {
			t.Fatalf("pages do not end: %+v", l)
		}
		path = "/v1/events?limit=2&starting_after=" + *l.NextStartingAfter
	}
	if got := strings.Join(seen, ","); got != "50:no_endpoint,40:no_endpoint,30:no_endpoint,20:no_endpoint,10:no_endpoint" {
		t.Errorf("events %s, want newest first", got)
	}
	if code := get(t, h, "/v1/events?starting_after=nonsense", w.key, nil); code == http.StatusOK {
		t.Errorf("a malformed starting_after answered 200")
	}
}

// Singles, batches, stream checkpoints and corrections (down and up) race
// across many thresholds: every threshold the total reached has exactly
// one event, recorded with a total at or past it, and none other.
func TestMixedRaceRecordsEachReachedThresholdOnce(t *testing.T) {
	t.Parallel()
	at := []int{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}
	w := newWorld(t, worldOpts{in: 10_000, out: 10_000, alertAt: at})
	ctx := context.Background()
	now := time.Now()
	seed := make([]uuid.UUID, 4)
	for i := range seed {
		seed[i] = w.single(t, now, 300, 1) // 1,200: across 10%
	}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	do := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				errs <- err
			}
		}()
	}
	for i := range 8 {
		do(func() error { return w.batch(ctx, 10, 50, 1) }) // 8 × 500
		do(func() error {
			key := uuid.NewString()
			_, err := w.svc.Record(ctx, ingest.RecordParams{TenantID: w.tenant, Key: key, Fingerprint: []byte(key),
				Event: &ingest.Event{RequestID: rid(), Timestamp: now.UTC().Truncate(time.Microsecond), UserID: "u", ModelID: "m", InputTokens: 250, OutputTokens: 1}})
			return err
		}) // 8 × 250
		do(func() error {
			r := fmt.Sprintf("stream-%d-%s", i, uuid.NewString()[:6])
			for n, total := range []int64{100, 200, 300} {
				key := fmt.Sprintf("%s:%d", r, n)
				if _, err := w.svc.Checkpoint(ctx, ingest.RecordParams{TenantID: w.tenant, Key: key, Fingerprint: []byte(key),
					Event: &ingest.Event{RequestID: &r, Timestamp: now.UTC().Truncate(time.Microsecond), UserID: "u", ModelID: "m",
						InputTokens: total, OutputTokens: 1, Stream: &ingest.Checkpoint{Sequence: int64(n), Final: n == 2}}}); err != nil {
					return err
				}
			}
			return nil
		}) // 8 × 300
	}
	for i, id := range seed {
		corrected := int64(0) // down by 300 each...
		if i%2 == 1 {
			corrected = 900 // ...or up by 600
		}
		do(func() error {
			key := uuid.NewString()
			_, err := w.svc.Correct(ctx, ingest.CorrectParams{UsageLogID: id, Key: key, Fingerprint: []byte(key), InputTokens: corrected, OutputTokens: 1, Reason: "race"})
			return err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var total int64
	if err := w.pool.QueryRow(ctx, `SELECT sum(input_tokens) FROM usage_logs WHERE tenant_id = $1`, w.tenant).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if total != 1200+4000+2000+2400+600 { // 10,200: past 100%
		t.Fatalf("total %d", total)
	}
	ev := w.events(t)
	if len(ev) != len(at) {
		t.Fatalf("%d events, want one per threshold (%d): %+v", len(ev), len(at), ev)
	}
	for i, e := range ev {
		if e.meter != "input" || e.pct != at[i] || e.used < alerts.Level(10_000, at[i]) {
			t.Errorf("event %d: %+v", i, e)
		}
	}
}

// A tenant whose endpoint hangs holds up no other tenant's deliveries:
// its attempts take at most PerTenant workers, each cut at the timeout.
func TestHangingTenantDelaysNoOther(t *testing.T) {
	t.Parallel()
	hang := make(chan struct{})
	var hung, inFlight, most atomic.Int64
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hung.Add(1)
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		select {
		case <-r.Context().Done():
		case <-hang:
		}
	}))
	// Cleanups run last in, first out: the workers (registered below)
	// stop first, then the hanging requests are let go, then the servers.
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(hang) })
	fast := &receiver{answer: func(int, *http.Request) int { return http.StatusOK }}
	fastSrv := httptest.NewServer(fast)
	t.Cleanup(fastSrv.Close)
	cfg := fastDelivery()
	cfg.Timeout = 5 * time.Second
	a := newWorld(t, worldOpts{in: 100, out: 100, alertAt: []int{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}, url: slow.URL, deliver: cfg})
	a.single(t, time.Now(), 100, 100) // ten events of input, ten of output, to the hanging endpoint
	polltest.Until(t, "the hanging endpoint holding deliveries", 10*time.Second, func() bool { return hung.Load() >= 2 })
	b := a.another(t, worldOpts{in: 100, out: 100, alertAt: []int{50}, url: fastSrv.URL})
	start := time.Now()
	b.single(t, time.Now(), 60, 1)
	polltest.Until(t, "the other tenant's event delivered", 4*time.Second, func() bool {
		return len(fast.deliveries()) == 1
	})
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the other tenant's delivery took %s", d)
	}
	if n := most.Load(); n > 2 {
		t.Errorf("%d attempts of the hanging tenant at once, want at most PerTenant (2)", n)
	}
}

// Two runs of one event's job at once (a job rescued while its first run
// still delivers) make one delivery: the second finds the lease taken.
func TestNoTwoDeliveriesOfOneEventInFlight(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		<-release
	}))
	defer srv.Close()
	w := newWorld(t, worldOpts{in: 100, out: 100, alertAt: []int{80}, url: srv.URL})
	w.single(t, time.Now(), 90, 1)
	var id uuid.UUID
	if err := w.pool.QueryRow(context.Background(), `SELECT id FROM alert_events WHERE tenant_id = $1`, w.tenant).Scan(&id); err != nil {
		t.Fatal(err)
	}
	d := alerts.NewDeliverer(w.pool, alerts.DeliverConfig{Timeout: 5 * time.Second, PerTenant: 10})
	job := func(jobID int64) *river.Job[alerts.DeliverArgs] {
		return &river.Job[alerts.DeliverArgs]{JobRow: &rivertype.JobRow{ID: jobID, Attempt: 1}, Args: alerts.DeliverArgs{EventID: id}}
	}
	first := make(chan error, 1)
	go func() { first <- d.Work(context.Background(), job(1)) }()
	polltest.Until(t, "the first delivery in flight", 5*time.Second, func() bool { return got.Load() == 1 })
	err := d.Work(context.Background(), job(2))
	var snooze *river.JobSnoozeError
	if !errors.As(err, &snooze) {
		t.Errorf("a second run while the first delivers: %v, want a snooze", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("the first run: %v", err)
	}
	if err := d.Work(context.Background(), job(3)); err != nil {
		t.Errorf("a run after delivery: %v, want done", err)
	}
	if n := got.Load(); n != 1 {
		t.Errorf("%d deliveries, want 1", n)
	}
}
