package webhooks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stripe/stripe-go/v79/webhook"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/api"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/usagelog"
	"github.com/overage-billing/overage/webhooks"
	"github.com/overage-billing/overage/workers"
	"github.com/riverqueue/river/rivertype"
)

const secret = "whsec_test_secret"

type harness struct {
	pool    *pgxpool.Pool
	rc      *river.Client[pgx.Tx] // insert-only, as in `serve`
	handler *webhooks.Handler
	url     string
}

func setup(t *testing.T) *harness {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	return newHarness(t, pool)
}

// newHarness serves the webhook endpoint on pool's database.
func newHarness(t *testing.T, pool *pgxpool.Pool) *harness {
	t.Helper()
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := webhooks.NewHandler(webhooks.HandlerConfig{Pool: pool, River: rc, Secret: secret})
	srv := httptest.NewServer(api.NewRouter(api.Config{DB: pool, Handlers: []api.Mounter{h}}))
	t.Cleanup(srv.Close)
	return &harness{pool: pool, rc: rc, handler: h, url: srv.URL + "/v1/webhooks/stripe"}
}

// startProcessor runs a River client working the webhooks queue, as `work`
// does; the returned func stops it (a "crash" or a restart).
func (h *harness) startProcessor(t *testing.T) func() {
	t.Helper()
	ws := river.NewWorkers()
	if err := workers.AddWebhookWorkers(ws, h.pool, h.pool, nil); err != nil {
		t.Fatal(err)
	}
	c, err := river.NewClient(riverpgxv5.New(h.pool), &river.Config{
		Workers:           ws,
		Queues:            map[string]river.QueueConfig{outbox.QueueWebhooks: workers.WebhooksQueue()},
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	var stopped atomic.Bool
	stop := func() {
		if stopped.CompareAndSwap(false, true) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := c.Stop(ctx); err != nil {
				t.Errorf("stop river: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return stop
}

func (h *harness) tenant(t *testing.T, cus string, includedInput int64) *tenants.Created {
	t.Helper()
	tn, err := tenants.NewStore(h.pool).Create(context.Background(), tenants.CreateParams{Name: cus, StripeCustomerID: cus, IncludedInputTokens: includedInput})
	if err != nil {
		t.Fatal(err)
	}
	return tn
}

// eventJSON renders a Stripe event. account "" is the platform.
func eventJSON(id, account, typ string, created time.Time, obj any) []byte {
	ev := map[string]any{
		"id": id, "object": "event", "api_version": "2024-06-20", "created": created.Unix(),
		"type": typ, "livemode": false, "pending_webhooks": 1, "data": map[string]any{"object": obj},
	}
	if account != "" {
		ev["account"] = account
	}
	b, _ := json.Marshal(ev)
	return b
}

func subscription(id, cus, status string, start, end time.Time) map[string]any {
	return map[string]any{"id": id, "object": "subscription", "customer": cus, "status": status,
		"current_period_start": start.Unix(), "current_period_end": end.Unix()}
}

// post delivers body signed with sec at ts (the Stripe-Signature header
// omitted when sec is empty) and returns the status and body.
func (h *harness) post(t *testing.T, body []byte, sec string, ts time.Time) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if sec != "" {
		sp := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: sec, Timestamp: ts})
		req.Header.Set("Stripe-Signature", sp.Header)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (h *harness) deliver(t *testing.T, body []byte) {
	t.Helper()
	if st, b := h.post(t, body, secret, time.Now()); st != http.StatusOK {
		t.Fatalf("delivery answered %d %s, want 200", st, b)
	}
}

func (h *harness) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := h.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// webhookJobs counts the webhook jobs River lists, in the states given (in
// any state when none is).
func (h *harness) webhookJobs(t *testing.T, states ...rivertype.JobState) int {
	t.Helper()
	p := river.NewJobListParams().Kinds(outbox.ProcessWebhookArgs{}.Kind()).First(1000)
	if len(states) > 0 {
		p = p.States(states...)
	}
	res, err := h.rc.JobList(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return len(res.Jobs)
}

func (h *harness) waitAllProcessed(t *testing.T, n int) {
	t.Helper()
	polltest.Until(t, fmt.Sprintf("%d processed events", n), 20*time.Second, func() bool {
		return h.count(t, `SELECT count(*) FROM stripe_webhook_events WHERE processed_at IS NOT NULL`) == n &&
			h.count(t, `SELECT count(*) FROM stripe_webhook_events WHERE processed_at IS NULL`) == 0
	})
}

func TestValidDeliveryIsStoredQueuedAndApplied(t *testing.T) {
	t.Parallel()
	h := setup(t)
	tn := h.tenant(t, "cus_valid", 0)
	start := time.Now().Add(-time.Hour).Truncate(time.Second)
	h.deliver(t, eventJSON("evt_valid", "", "customer.subscription.created", time.Now(),
		subscription("sub_1", "cus_valid", "active", start, start.Add(30*24*time.Hour))))
	if n := h.count(t, `SELECT count(*) FROM stripe_webhook_events WHERE event_id = 'evt_valid' AND account = 'platform'
		AND type = 'customer.subscription.created' AND api_version = '2024-06-20' AND processed_at IS NULL`); n != 1 {
		t.Fatalf("%d stored rows, want 1 unprocessed", n)
	}
	if n := h.webhookJobs(t); n != 1 {
		t.Fatalf("%d webhook jobs, want 1", n)
	}
	h.startProcessor(t)
	h.waitAllProcessed(t, 1)
	var status string
	var ps time.Time
	if err := h.pool.QueryRow(context.Background(), `SELECT status, current_period_start FROM tenant_subscriptions WHERE tenant_id = $1`, tn.ID).Scan(&status, &ps); err != nil {
		t.Fatal(err)
	}
	if status != "active" || !ps.Equal(start) {
		t.Fatalf("subscription %s from %s, want active from %s", status, ps, start)
	}
}

func TestRefusedDeliveriesWriteNothing(t *testing.T) {
	t.Parallel()
	h := setup(t)
	body := eventJSON("evt_refused", "", "customer.deleted", time.Now(), map[string]any{"id": "cus_x"})
	big := append([]byte(`{"id":"evt_big","pad":"`), bytes.Repeat([]byte("a"), webhooks.MaxBodyBytes)...)
	big = append(big, `"}`...)
	sp := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret})
	tampered := bytes.Replace(body, []byte("cus_x"), []byte("cus_y"), 1)
	for _, c := range []struct {
		name   string
		body   []byte
		header string
		want   int
	}{
		{"unsigned", body, "", http.StatusBadRequest},
		{"tampered", tampered, sp.Header, http.StatusBadRequest},
		{"wrong secret", body, webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: "whsec_other"}).Header, http.StatusBadRequest},
		{"stale (10 minutes old)", body, webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: time.Now().Add(-10 * time.Minute)}).Header, http.StatusBadRequest},
		{"garbage header", body, "t=abc,v1=zz", http.StatusBadRequest},
		{"oversized", big, webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: big, Secret: secret}).Header, http.StatusRequestEntityTooLarge},
	} {
		req, _ := http.NewRequest(http.MethodPost, h.url, bytes.NewReader(c.body))
		if c.header != "" {
			req.Header.Set("Stripe-Signature", c.header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want || !strings.Contains(resp.Header.Get("Content-Type"), "problem+json") {
			t.Errorf("%s: %d %s %s, want %d problem", c.name, resp.StatusCode, resp.Header.Get("Content-Type"), b, c.want)
		}
	}
	if n := h.count(t, `SELECT count(*) FROM stripe_webhook_events`); n != 0 {
		t.Fatalf("%d rows stored from refused deliveries", n)
	}
	if n := h.webhookJobs(t); n != 0 {
		t.Fatalf("%d jobs queued from refused deliveries", n)
	}

	// No secret configured: everything is refused, 503 so Stripe retries.
	rc, _ := river.NewClient(riverpgxv5.New(h.pool), &river.Config{})
	srv := httptest.NewServer(api.NewRouter(api.Config{DB: h.pool, Handlers: []api.Mounter{webhooks.NewHandler(webhooks.HandlerConfig{Pool: h.pool, River: rc})}}))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/webhooks/stripe", bytes.NewReader(body))
	req.Header.Set("Stripe-Signature", webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: ""}).Header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("without a secret: %d, want 503", resp.StatusCode)
	}
}

func TestSameDeliveryTwiceIsProcessedOnce(t *testing.T) {
	t.Parallel()
	h := setup(t)
	body := eventJSON("evt_dup", "", "billing.meter.error_report_triggered", time.Now(),
		map[string]any{"id": "mtr_1", "object": "billing.meter"})
	h.deliver(t, body)
	h.deliver(t, body) // before processing: the live job is reused
	if n := h.webhookJobs(t); n != 1 {
		t.Fatalf("%d jobs, want 1", n)
	}
	h.startProcessor(t)
	h.waitAllProcessed(t, 1)
	var first time.Time
	if err := h.pool.QueryRow(context.Background(), `SELECT processed_at FROM stripe_webhook_events`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, "the job to complete", 20*time.Second, func() bool {
		return h.webhookJobs(t, rivertype.JobStateCompleted) == 1
	})
	h.deliver(t, body) // after processing: nothing new
	if n := h.webhookJobs(t); n != 1 {
		t.Fatalf("%d jobs after a redelivery of a processed event, want 1", n)
	}
	var again time.Time
	if err := h.pool.QueryRow(context.Background(), `SELECT processed_at FROM stripe_webhook_events`).Scan(&again); err != nil {
		t.Fatal(err)
	}
	if !again.Equal(first) || h.count(t, `SELECT count(*) FROM stripe_webhook_events`) != 1 {
		t.Fatal("the redelivery was stored or processed again")
	}
	if n := h.count(t, `SELECT count(*) FROM meter_error_reports WHERE meter_id = 'mtr_1'`); n != 1 {
		t.Fatalf("%d meter error reports, want 1", n)
	}
}

func TestSameEventIDForTwoAccountsIsProcessedTwice(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.deliver(t, eventJSON("evt_shared", "", "invoice.paid", time.Now(), map[string]any{"id": "in_1"}))
	h.deliver(t, eventJSON("evt_shared", "acct_connected", "invoice.paid", time.Now(), map[string]any{"id": "in_1"}))
	h.startProcessor(t)
	h.waitAllProcessed(t, 2)
	if n := h.count(t, `SELECT count(DISTINCT account) FROM stripe_webhook_events WHERE event_id = 'evt_shared' AND processed_at IS NOT NULL AND process_outcome = 'ignored'`); n != 2 {
		t.Fatalf("%d accounts processed, want 2", n)
	}
}

func TestStoredButUnprocessedEventIsProcessedAfterACrash(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.tenant(t, "cus_crash", 0)
	body := eventJSON("evt_crash", "", "customer.deleted", time.Now(), map[string]any{"id": "cus_crash", "object": "customer"})
	h.deliver(t, body)
	// The process dies before the job runs and the job is lost (cleaned up,
	// discarded): the row alone says it is not done.
	if _, err := h.rc.JobDeleteMany(context.Background(), river.NewJobDeleteManyParams().Kinds(outbox.ProcessWebhookArgs{}.Kind())); err != nil {
		t.Fatal(err)
	}
	// Nothing is left that could process it: River lists no webhook job.
	if n := h.webhookJobs(t); n != 0 {
		t.Fatalf("%d webhook jobs left after deleting them", n)
	}
	if n := h.count(t, `SELECT count(*) FROM stripe_webhook_events WHERE processed_at IS NULL`); n != 1 {
		t.Fatal("the stored event is not waiting to be processed")
	}
	// Stripe redelivers: the duplicate gets a job, the restarted worker applies it.
	res, err := h.handler.Store(context.Background(), webhooks.StoredEvent{ID: "evt_crash", Account: webhooks.PlatformAccount, Type: "customer.deleted", Payload: body})
	if err != nil || !res.Duplicate || !res.Requeued {
		t.Fatalf("redelivery: %+v %v, want a requeued duplicate", res, err)
	}
	h.startProcessor(t)
	h.waitAllProcessed(t, 1)
	if n := h.count(t, `SELECT count(*) FROM tenants WHERE stripe_customer_id = 'cus_crash' AND suspended_at IS NOT NULL`); n != 1 {
		t.Fatal("tenant not suspended")
	}

	// Without any redelivery: a row with no job is applied, in order, by
	// the next event's job.
	if _, err := h.pool.Exec(context.Background(), `INSERT INTO stripe_webhook_events (event_id, account, type, payload)
		VALUES ('evt_orphan', 'platform', 'invoice.paid', '{}')`); err != nil {
		t.Fatal(err)
	}
	h.deliver(t, eventJSON("evt_next", "", "invoice.paid", time.Now(), map[string]any{"id": "in_2"}))
	h.waitAllProcessed(t, 3)
	requireProcessedInSeqOrder(t, h)

	// Nothing arrives after it: the periodic reaper's requeue applies it.
	if _, err := h.pool.Exec(context.Background(), `INSERT INTO stripe_webhook_events (event_id, account, type, payload, received_at)
		VALUES ('evt_lonely', 'platform', 'invoice.paid', '{}', now() - interval '2 minutes')`); err != nil {
		t.Fatal(err)
	}
	if err := webhooks.NewReaper(h.pool, nil).Requeue(context.Background(), h.rc); err != nil {
		t.Fatal(err)
	}
	h.waitAllProcessed(t, 4)
}

func requireProcessedInSeqOrder(t *testing.T, h *harness) {
	t.Helper()
	rows, err := h.pool.Query(context.Background(), `SELECT seq FROM stripe_webhook_events ORDER BY processed_at`)
	if err != nil {
		t.Fatal(err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] < seqs[i-1] {
			t.Fatalf("processed in order %v, want arrival (seq) order", seqs)
		}
	}
}

func TestEventsAreProcessedInArrivalOrderWhateverTheJobOrder(t *testing.T) {
	t.Parallel()
	h := setup(t)
	tn := h.tenant(t, "cus_order", 0)
	start := time.Now().Add(-time.Hour).Truncate(time.Second)
	now := time.Now()
	// Same Stripe created second: only arrival order decides the result.
	for i, st := range []string{"trialing", "past_due", "active"} {
		h.deliver(t, eventJSON(fmt.Sprintf("evt_o%d", i), "", "customer.subscription.updated", now,
			subscription("sub_o", "cus_order", st, start, start.Add(time.Duration(i+1)*24*time.Hour))))
	}
	// The last event's job runs first; the others' much later.
	if tag, err := h.pool.Exec(context.Background(), `UPDATE river_job SET scheduled_at = now() + interval '1 hour', state = 'scheduled'
		WHERE (args->>'seq')::bigint < (SELECT max(seq) FROM stripe_webhook_events)`); err != nil || tag.RowsAffected() != 2 {
		t.Fatalf("postpone the first two jobs: %v %v", tag, err)
	}
	h.startProcessor(t)
	h.waitAllProcessed(t, 3)
	requireProcessedInSeqOrder(t, h)
	var status string
	if err := h.pool.QueryRow(context.Background(), `SELECT status FROM tenant_subscriptions WHERE tenant_id = $1`, tn.ID).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "active" {
		t.Fatalf("status %s, want the last arrival's active", status)
	}
}

func record(t *testing.T, svc *ingest.Service, pool *pgxpool.Pool, tenant uuid.UUID, ts time.Time, in int64) (overage.UsageLog, time.Time) {
	t.Helper()
	key := uuid.NewString()
	o, err := svc.Record(context.Background(), ingest.RecordParams{TenantID: tenant, Key: key, Fingerprint: []byte(key),
		Event: &ingest.Event{Timestamp: ts, UserID: "u", ModelID: "m", InputTokens: in}})
	if err != nil {
		t.Fatal(err)
	}
	var l overage.UsageLog
	if err := json.Unmarshal(o.Body, &l); err != nil {
		t.Fatal(err)
	}
	var period time.Time
	if err := pool.QueryRow(context.Background(), `SELECT period_start FROM usage_logs WHERE id = $1`, l.ID).Scan(&period); err != nil {
		t.Fatal(err)
	}
	return l, period
}

func TestSubscriptionUpdateMovesTheAllowancePeriod(t *testing.T) {
	t.Parallel()
	h := setup(t)
	tn := h.tenant(t, "cus_period", 500)
	svc := ingest.NewService(h.pool, outbox.NewInserter(h.rc, outbox.DefaultMaxAttempts))
	ts := time.Now().Add(-time.Minute).UTC().Truncate(time.Microsecond)
	month := time.Date(ts.Year(), ts.Month(), 1, 0, 0, 0, 0, time.UTC)

	l, period := record(t, svc, h.pool, tn.ID, ts, 400)
	if l.Overage.InputTokens != 0 || !period.Equal(month) {
		t.Fatalf("before any subscription: overage %d in period %s, want 0 in %s", l.Overage.InputTokens, period, month)
	}

	subStart := time.Now().Add(-time.Hour).Truncate(time.Second).UTC()
	h.deliver(t, eventJSON("evt_period", "", "customer.subscription.updated", time.Now(),
		subscription("sub_p", "cus_period", "active", subStart, subStart.Add(30*24*time.Hour))))
	h.startProcessor(t)
	h.waitAllProcessed(t, 1)

	// The new period's running total starts from zero: in the calendar
	// month this 400 would have crossed the 500 allowance by 300.
	l, period = record(t, svc, h.pool, tn.ID, ts, 400)
	if !period.Equal(subStart) || l.Overage.InputTokens != 0 {
		t.Fatalf("after the update: overage %d in period %s, want 0 in %s", l.Overage.InputTokens, period, subStart)
	}
	l, _ = record(t, svc, h.pool, tn.ID, ts, 200)
	if l.Overage.InputTokens != 100 || l.BillingStatus != overage.BillingStatusPending {
		t.Fatalf("crossing the period's allowance: overage %d (%s), want 100 pending", l.Overage.InputTokens, l.BillingStatus)
	}
	// Usage before the subscription period stays in the calendar month.
	_, period = record(t, svc, h.pool, tn.ID, subStart.Add(-time.Minute), 1)
	if !period.Equal(time.Date(subStart.Add(-time.Minute).Year(), subStart.Add(-time.Minute).Month(), 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("usage before the period went to %s", period)
	}
}

// customer.deleted suspends the tenant: its report job sends nothing and
// fails nothing, its logs wait pending (the sweep leaves them alone) while
// another tenant is billed. Giving it a customer Stripe does not know, or
// asking while Stripe is unreachable, changes nothing; a customer Stripe
// knows lifts the suspension and the logs that waited are billed, to the
// new customer, by the same workers.
func TestDeletedCustomerSuspendsTenantUntilACustomerStripeKnowsLiftsIt(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()
	gone := h.tenant(t, "cus_gone", 0)
	ok := h.tenant(t, "cus_ok", 0)
	h.deliver(t, eventJSON("evt_del", "", "customer.deleted", time.Now(), map[string]any{"id": "cus_gone", "object": "customer"}))
	h.startProcessor(t)
	h.waitAllProcessed(t, 1)

	inserter := outbox.NewInserter(h.rc, outbox.DefaultMaxAttempts)
	svc := ingest.NewService(h.pool, inserter)
	ts := time.Now().Add(-time.Minute).UTC().Truncate(time.Microsecond)
	// A report sent to the customer before Stripe deleted it, its answer
	// never recorded: formed (its first attempt committed), then released.
	sent, _ := record(t, svc, h.pool, gone.ID, ts, 40)
	reports, err := usagelog.New(h.pool).Form(ctx, usagelog.FormParams{TenantID: gone.ID, MaxLogs: 10, Lease: time.Minute, Guard: usagelog.GuardFor(24 * time.Hour)})
	if err != nil || len(reports) == 0 {
		t.Fatalf("form the report sent before the deletion: %v, %d reports", err, len(reports))
	}
	if err := usagelog.New(h.pool).Release(ctx, reports); err != nil {
		t.Fatal(err)
	}
	lg, _ := record(t, svc, h.pool, gone.ID, ts, 100)
	lo, _ := record(t, svc, h.pool, ok.ID, ts, 100)

	emu := emulator.New(emulator.Options{Seed: 1})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	emu.DeleteCustomer("cus_gone")
	sc, err := stripeclient.New(stripeclient.Config{SecretKey: "sk_test_123", APIBase: base, RateLimit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	w, err := workers.New(h.pool, workers.Config{Stripe: sc, SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() { cancel(); <-done }()

	status := func(id uuid.UUID) string {
		var s string
		if err := h.pool.QueryRow(ctx, `SELECT billing_status FROM usage_logs WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	completedJobs := func() int {
		res, err := h.rc.JobList(ctx, river.NewJobListParams().Kinds(outbox.ReportArgs{}.Kind()).
			States(rivertype.JobStateCompleted).Where("args->>'tenant_id' = @tenant", river.NamedArgs{"tenant": gone.ID.String()}))
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Jobs)
	}
	polltest.Until(t, "the other tenant's report to bill", 20*time.Second, func() bool { return status(lo.ID) == "billed" })
	// The suspended tenant's job ran and completed, leaving its log as it was.
	polltest.Until(t, "the suspended tenant's job to complete", 20*time.Second, func() bool { return completedJobs() >= 1 })
	if s := status(lg.ID); s != "pending" {
		t.Fatalf("the suspended tenant's log is %s, want pending", s)
	}
	for _, r := range emu.Requests() {
		if strings.Contains(r.IdempotencyKey, lg.ID.String()) || r.Customer == "cus_gone" {
			t.Fatalf("a meter event of the suspended tenant was sent: %+v", r)
		}
	}
	// The sweep does not requeue it: its job would only find it suspended.
	waiting, err := usagelog.New(h.pool).TenantsPendingSince(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(waiting, gone.ID) {
		t.Fatalf("the sweep would requeue the suspended tenant: %v", waiting)
	}

	suspended := func() bool {
		return h.count(t, `SELECT count(*) FROM tenants WHERE id = $1 AND suspended_at IS NOT NULL`, gone.ID) == 1
	}
	store := tenants.NewStore(h.pool).WithStripe(sc, inserter)
	for _, cus := range []string{"cus_gone", "cus_nobody"} {
		_, err := store.Update(ctx, gone.ID, tenants.UpdateParams{StripeCustomerID: &cus})
		if e := overage.AsError(err); e.Type != "validation-failed" || len(e.Fields) != 1 || e.Fields[0].Field != "stripe_customer_id" {
			t.Fatalf("lift with %s (unknown to Stripe): %v, want validation-failed naming stripe_customer_id", cus, err)
		}
	}
	// Stripe unreachable: unknown is not "no", and nothing changes.
	down := emulator.New(emulator.Options{})
	downBase, err := down.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down.Close()
	unreachable, err := stripeclient.New(stripeclient.Config{SecretKey: "sk_test_123", APIBase: downBase})
	if err != nil {
		t.Fatal(err)
	}
	cus := "cus_new"
	emu.AddCustomer(cus)
	_, err = tenants.NewStore(h.pool).WithStripe(unreachable, inserter).Update(ctx, gone.ID, tenants.UpdateParams{StripeCustomerID: &cus})
	if e := overage.AsError(err); e.Type != "stripe-unavailable" || e.Code != overage.EUNAVAILABLE {
		t.Fatalf("lift while Stripe is unreachable: %v, want stripe-unavailable", err)
	}
	// Without Stripe's credentials a lift cannot be checked either.
	if _, err := tenants.NewStore(h.pool).Update(ctx, gone.ID, tenants.UpdateParams{StripeCustomerID: &cus}); overage.AsError(err).Type != "stripe-unavailable" {
		t.Fatalf("lift without Stripe: %v, want stripe-unavailable", err)
	}
	if !suspended() || h.count(t, `SELECT count(*) FROM tenants WHERE id = $1 AND stripe_customer_id = 'cus_gone'`, gone.ID) != 1 {
		t.Fatal("a refused lift changed the tenant")
	}

	d, err := store.Update(ctx, gone.ID, tenants.UpdateParams{StripeCustomerID: &cus})
	if err != nil {
		t.Fatal(err)
	}
	if d.SuspendedAt != nil || d.SuspendedReason != nil || d.StripeCustomerID != cus || suspended() {
		t.Fatalf("after the lift: %+v", d)
	}
	polltest.Until(t, "the log that waited to bill", 20*time.Second, func() bool { return status(lg.ID) == "billed" })
	if got := emu.Applied()[emulator.AppliedKey{Customer: cus, EventName: overage.DefaultMeterInputEvent}]; got != 100 {
		t.Fatalf("Stripe holds %d input tokens for %s, want the 100 that waited", got, cus)
	}
	// The report already sent to the deleted customer is not resent to the
	// new one under its key: an operator decides.
	var msg string
	if err := h.pool.QueryRow(ctx, `SELECT billing_status || ': ' || billing_message FROM usage_logs WHERE id = $1`, sent.ID).Scan(&msg); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(msg, "needs_review: ") || !strings.Contains(msg, "cus_gone") {
		t.Fatalf("the log sent to the deleted customer: %q, want needs_review naming cus_gone", msg)
	}
	for _, r := range emu.Requests() {
		if strings.Contains(r.IdempotencyKey, sent.ID.String()) {
			t.Fatalf("the report sent to the deleted customer was resent: %+v", r)
		}
	}
}

func TestPeriodicRetentionJobRunsUnderRiver(t *testing.T) {
	t.Parallel()
	h := setup(t)
	old := h.repartition(t, h.dbNow(t).Add(-400*24*time.Hour))[0].Name
	if _, err := h.pool.Exec(context.Background(), `INSERT INTO stripe_webhook_events (event_id, account, type, payload, received_at, processed_at) VALUES
		('evt_old', 'platform', 'x', '{}', now() - interval '401 days', now() - interval '401 days'),
		('evt_jobless', 'platform', 'invoice.paid', '{}', now() - interval '2 minutes', NULL)`); err != nil {
		t.Fatal(err)
	}
	ws := river.NewWorkers()
	if err := workers.AddWebhookWorkers(ws, h.pool, h.pool, nil); err != nil {
		t.Fatal(err)
	}
	c, err := river.NewClient(riverpgxv5.New(h.pool), &river.Config{
		Workers: ws,
		Queues: map[string]river.QueueConfig{
			outbox.QueueWebhooks: workers.WebhooksQueue(), outbox.QueueMaintenance: {MaxWorkers: 2},
		},
		PeriodicJobs:      []*river.PeriodicJob{workers.WebhookRetentionJob(time.Hour)},
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	polltest.Until(t, "retention and requeue", 20*time.Second, func() bool {
		return h.count(t, `SELECT count(*) FROM pg_class WHERE relname = $1`, old) == 0 &&
			h.count(t, `SELECT count(*) FROM stripe_webhook_events WHERE event_id = 'evt_jobless' AND processed_at IS NOT NULL`) == 1
	})
	if n := h.count(t, `SELECT count(*) FROM stripe_webhook_events WHERE event_id = 'evt_old'`); n != 0 {
		t.Fatal("the old event outlived its partition")
	}
}

func invoice(id, cus, sub, reason string, start, end time.Time) map[string]any {
	return map[string]any{"id": id, "object": "invoice", "customer": cus, "subscription": sub, "billing_reason": reason,
		"status": "open", "period_start": start.Unix(), "period_end": end.Unix()}
}

// invoice.finalized of a subscription cycle closes the period it billed
// before PERIOD_CLOSE_GRACE is over: a late log of that period answers
// "reported" and its meter event carries its send time, not its usage
// time. An invoice of another kind closes nothing.
func TestFinalizedInvoiceClosesItsPeriodInsideTheGrace(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()
	tn := h.tenant(t, "cus_inv", 500)
	svc := ingest.NewService(h.pool, outbox.NewInserter(h.rc, outbox.DefaultMaxAttempts))
	svc.SetPeriodCloseGrace(time.Hour)
	// The subscription's period ended 10 minutes ago: inside the grace.
	end := time.Now().Add(-10 * time.Minute).Truncate(time.Second).UTC()
	start := end.Add(-30 * 24 * time.Hour)
	h.deliver(t, eventJSON("evt_sub", "", "customer.subscription.updated", time.Now(), subscription("sub_inv", "cus_inv", "active", start, end)))
	h.deliver(t, eventJSON("evt_manual", "", "invoice.finalized", time.Now(), invoice("in_manual", "cus_inv", "sub_inv", "manual", start, end)))
	h.startProcessor(t)
	h.waitAllProcessed(t, 2)
	if n := h.count(t, `SELECT count(*) FROM stripe_webhook_events WHERE event_id = 'evt_manual' AND process_outcome LIKE 'ignored%'`); n != 1 {
		t.Fatal("a manual invoice was not ignored")
	}
	usage := end.Add(-48 * time.Hour).Truncate(time.Microsecond)
	early, period := record(t, svc, h.pool, tn.ID, usage, 600)
	if !period.Equal(start) || early.StripeTimestamp != usagelog.TimestampUsage {
		t.Fatalf("inside the grace: period %s, stripe_timestamp %q; want %s, usage", period, early.StripeTimestamp, start)
	}

	h.deliver(t, eventJSON("evt_inv", "", "invoice.finalized", time.Now(), invoice("in_cycle", "cus_inv", "sub_inv", "subscription_cycle", start, end)))
	h.deliver(t, eventJSON("evt_inv_again", "", "invoice.finalized", time.Now(), invoice("in_cycle", "cus_inv", "sub_inv", "subscription_cycle", start, end)))
	h.waitAllProcessed(t, 4)
	if n := h.count(t, `SELECT count(*) FROM closed_periods WHERE tenant_id = $1 AND period_end = $2`, tn.ID, end); n != 1 {
		t.Fatalf("%d closed periods, want the invoice's one", n)
	}
	closedAt := time.Now().Add(-time.Second)
	late, period := record(t, svc, h.pool, tn.ID, usage, 100)
	if !period.Equal(start) || late.StripeTimestamp != usagelog.TimestampReported || late.Overage.InputTokens != 100 {
		t.Fatalf("after invoice.finalized: period %s, stripe_timestamp %q, overage %d; want %s, reported, 100 (against the period's 500)",
			period, late.StripeTimestamp, late.Overage.InputTokens, start)
	}
	// The GET of the log recorded before: not formed yet, its period closed now.
	got, err := svc.Get(ctx, early.ID, nil)
	if err != nil || got.StripeTimestamp != usagelog.TimestampReported {
		t.Fatalf("GET of the earlier log: %v, %+v; want reported", err, got)
	}

	emu := emulator.New(emulator.Options{Seed: 1})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	sc, err := stripeclient.New(stripeclient.Config{SecretKey: "sk_test_123", APIBase: base, RateLimit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	w, err := workers.New(h.pool, workers.Config{Stripe: sc, SweepInterval: time.Hour, PeriodCloseGrace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	polltest.Until(t, "both logs billed", 20*time.Second, func() bool {
		return h.count(t, `SELECT count(*) FROM usage_logs WHERE tenant_id = $1 AND billing_status = 'billed' AND stripe_timestamp = 'reported'`, tn.ID) == 2
	})
	var sum int64
	for _, e := range emu.Events() {
		sum += e.Value
		if e.Timestamp.Before(closedAt.Truncate(time.Second)) {
			t.Errorf("meter event %s carries %s, want its send time (after %s), not the usage time %s", e.Identifier, e.Timestamp, closedAt, usage)
		}
	}
	if sum != 200 {
		t.Fatalf("Stripe holds %d, want 200 (700 against the closed period's 500)", sum)
	}
}
