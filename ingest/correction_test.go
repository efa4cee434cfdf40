package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/billingtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/worktest"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/workers"
)

func correction(in, out int, reason string) string {
	return fmt.Sprintf(`{"input_tokens":%d,"output_tokens":%d,"reason":%q}`, in, out, reason)
}

func (b *bundle) correct(t *testing.T, apiKey, idemKey, id, body string) response {
	t.Helper()
	return b.do(t, http.MethodPost, "/v1/usage-events/"+id+"/corrections", apiKey, idemKey, body)
}

// A correction of a log inside the allowance, one across it and one above
// it: each refunds or charges exactly the change of the period's overage,
// and what Stripe holds, net, is always the period's overage
// max(0, T - A) — never less than zero, the allowance given back.
func TestCorrectionBillsTheChangeOfThePeriodsOverage(t *testing.T) {
	t.Parallel()
	const allowance = 1000
	w := worktest.New(t, worktest.Options{Tenants: []tenants.CreateParams{{StripeCustomerID: "cus_cap", IncludedInputTokens: allowance}}})
	tenant := w.Tenants["cus_cap"].ID
	ts := time.Now().Add(-time.Minute)
	inside := worktest.Record(t, w.Ingest, tenant, ts, 600, 0) // total 600: no overage
	across := worktest.Record(t, w.Ingest, tenant, ts, 600, 0) // total 1200: 200 over
	above := worktest.Record(t, w.Ingest, tenant, ts, 500, 0)  // total 1700: 500 over
	w.Start(t, workers.Config{})
	key := emulator.AppliedKey{Customer: "cus_cap", EventName: billingtest.InputEvent}
	waitApplied := func(want int64) {
		t.Helper()
		polltest.Until(t, fmt.Sprintf("Stripe to hold %d", want), 30*time.Second, func() bool {
			var pending int
			if err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM usage_logs WHERE billing_status = 'pending'`).Scan(&pending); err != nil {
				t.Fatal(err)
			}
			return pending == 0 && w.Emu.Applied()[key] == want
		})
		billingtest.RequireStripeMatchesBilled(t, w.Pool, w.Emu)
	}
	waitApplied(700)

	total := int64(1700)
	for i, c := range []struct {
		name        string
		id          uuid.UUID
		from, to    int64
		wantOverage int64
	}{
		{"above the allowance, stays above", above, 500, 100, -400},       // 1700 -> 1300
		{"inside the allowance, voided", inside, 600, 0, -300},            // 1300 -> 700: the allowance given back
		{"across the allowance, raised", across, 600, 1000, 100},          // 700 -> 1100
		{"across the allowance, lowered below it", across, 1000, 0, -100}, // 1100 -> 100
	} {
		key := fmt.Sprintf("correction-%d", i)
		out, err := w.Ingest.Correct(context.Background(), ingest.CorrectParams{UsageLogID: c.id, Key: key, Fingerprint: []byte(key),
			InputTokens: c.to, Reason: c.name})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var got struct {
			overage.UsageLog
			StripeTimestamp string `json:"stripe_timestamp"`
		}
		if err := json.Unmarshal(out.Body, &got); err != nil {
			t.Fatal(err)
		}
		if out.Status != http.StatusAccepted || got.Kind != "correction" || got.Corrects == nil || *got.Corrects != c.id ||
			got.InputTokens != c.to-c.from || got.Overage.InputTokens != c.wantOverage || got.StripeTimestamp != ingest.TimestampOriginal {
			t.Fatalf("%s: answer %d %s, want a correction of %d tokens with overage %d at the original's time", c.name, out.Status, out.Body, c.to-c.from, c.wantOverage)
		}
		total += c.to - c.from
		waitApplied(max(0, total-allowance))
	}
	// Each correction was its own meter event, at the original's time.
	var negative int
	for _, e := range w.Emu.Events() {
		if !e.Timestamp.Truncate(time.Second).Equal(ts.Truncate(time.Second)) {
			t.Fatalf("meter event %s at %s, want the originals' time %s", e.Identifier, e.Timestamp, ts)
		}
		if e.Value < 0 {
			negative++
		}
	}
	if negative != 3 {
		t.Fatalf("%d negative meter events, want 3: %+v", negative, w.Emu.Events())
	}
}

// A correction whose answer was lost is retried under its key: the stored
// answer comes back, byte for byte, and nothing is applied twice.
func TestCorrectionRetriedUnderItsKeyIsAppliedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.post(t, b.alice.APIKey, "k", event(70, 30)).json(t)["id"].(string)
	first := b.correct(t, b.alice.APIKey, "fix-1", id, correction(50, 30, "double-reported"))
	requireStatus(t, first, http.StatusAccepted)
	again := b.correct(t, b.alice.APIKey, "fix-1", id, correction(50, 30, "double-reported"))
	requireStatus(t, again, http.StatusAccepted)
	if string(again.body) != string(first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay %s, want %s with Idempotent-Replayed", again.body, first.body)
	}
	requireProblem(t, b.correct(t, b.alice.APIKey, "fix-1", id, correction(40, 30, "double-reported")), http.StatusConflict, "idempotency-key-reused")
	if n := b.count(t, `SELECT count(*) FROM usage_logs WHERE corrects = $1`, id); n != 1 {
		t.Fatalf("%d corrections, want 1", n)
	}
	m := first.json(t)
	if m["input_tokens"] != float64(-20) || m["output_tokens"] != float64(0) || m["reason"] != "double-reported" {
		t.Fatalf("correction %s, want -20 input tokens", first.body)
	}
	// The same corrected totals under a new key: nothing left to correct.
	requireProblem(t, b.correct(t, b.alice.APIKey, "fix-2", id, correction(50, 30, "again")), http.StatusUnprocessableEntity, "validation-failed")

	g := b.do(t, http.MethodGet, "/v1/usage-events/"+id, b.alice.APIKey, "", "").json(t)
	tot := g["corrected_totals"].(map[string]any)
	cs := g["corrections"].([]any)
	if tot["input_tokens"] != float64(50) || tot["output_tokens"] != float64(30) || len(cs) != 1 || cs[0].(map[string]any)["id"] != m["id"] {
		t.Fatalf("GET of the original %v, want corrected totals 50/30 and its one correction", g)
	}
}

func TestCorrectionOfAnotherTenantsLogIsNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.post(t, b.alice.APIKey, "k", event(70, 30)).json(t)["id"].(string)
	requireProblem(t, b.correct(t, b.bob.APIKey, "fix", id, correction(0, 0, "not yours")), http.StatusNotFound, "not-found")
	requireProblem(t, b.correct(t, b.alice.APIKey, "fix", uuid.NewString(), correction(0, 0, "none")), http.StatusNotFound, "not-found")
	requireProblem(t, b.correct(t, "", "fix", id, correction(0, 0, "who")), http.StatusUnauthorized, "unauthorized")
	p := requireProblem(t, b.correct(t, b.alice.APIKey, "fix", id, correction(-1, 0, "below zero")), http.StatusUnprocessableEntity, "validation-failed")
	if fmt.Sprint(p["errors"]) == "" || b.count(t, `SELECT count(*) FROM usage_logs WHERE corrects IS NOT NULL`) != 0 {
		t.Fatalf("refusals recorded a correction: %v", p)
	}
	// The operator may correct any tenant's log; 0/0 voids it.
	r := b.correct(t, adminToken, "fix", id, correction(0, 0, "voided by support"))
	requireStatus(t, r, http.StatusAccepted)
	if m := r.json(t); m["tenant_id"] != b.alice.ID.String() || m["input_tokens"] != float64(-70) || m["output_tokens"] != float64(-30) {
		t.Fatalf("void %s", r.body)
	}
	// A correction is not itself corrected.
	cid := r.json(t)["id"].(string)
	requireProblem(t, b.correct(t, b.alice.APIKey, "fix2", cid, correction(0, 0, "x")), http.StatusUnprocessableEntity, "validation-failed")
}

// Corrections of one log racing under different keys: the row lock on the
// original referees, so the corrected totals are reached exactly once.
func TestConcurrentCorrectionsOfOneLogApplyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.post(t, b.capped.APIKey, "k", event(1500, 300)).json(t)["id"].(string)
	var wg sync.WaitGroup
	statuses := make([]int, 8)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = b.correct(t, b.capped.APIKey, fmt.Sprintf("void-%d", i), id, correction(0, 0, "void")).status
		}()
	}
	wg.Wait()
	accepted := 0
	for _, s := range statuses {
		switch s {
		case http.StatusAccepted:
			accepted++
		case http.StatusUnprocessableEntity:
		default:
			t.Fatalf("statuses %v", statuses)
		}
	}
	if accepted != 1 {
		t.Fatalf("%d corrections accepted, want 1 (statuses %v)", accepted, statuses)
	}
	var in, out, oin, oout, total int64
	if err := b.pool.QueryRow(context.Background(), `SELECT sum(input_tokens), sum(output_tokens), sum(coalesce(overage_input_tokens, input_tokens)), sum(coalesce(overage_output_tokens, output_tokens)),
		(SELECT sum(input_tokens) FROM allowance_usage) FROM usage_logs`).Scan(&in, &out, &oin, &oout, &total); err != nil {
		t.Fatal(err)
	}
	if in != 0 || out != 0 || oin != 0 || oout != 0 || total != 0 {
		t.Fatalf("after the void: tokens %d/%d, overage %d/%d, period total %d; want all zero", in, out, oin, oout, total)
	}
}

// A correction that gives allowance back while an event of the same period
// is in flight on the unordered path (the total had reached the allowance
// when the event read it) does not leave that event charged in full: the
// event's transaction finds the lower total before it writes, rolls back
// and is redone in order, so the period's overage stays exact.
func TestCorrectionDuringAnUnorderedEventKeepsTheSplitExact(t *testing.T) {
	t.Parallel()
	const allowance = 1000
	// One report batch period for the whole test: the first event queues
	// its job, so neither the event in flight nor the correction inside it
	// waits on the other's report job row.
	w := worktest.New(t, worktest.Options{BatchDelay: 24 * time.Hour,
		Tenants: []tenants.CreateParams{{StripeCustomerID: "cus_cap", IncludedInputTokens: allowance}}})
	tenant := w.Tenants["cus_cap"].ID
	ts := time.Now().Add(-time.Minute)
	first := worktest.Record(t, w.Ingest, tenant, ts, 1500, 0) // total 1500: 500 over, the allowance used up
	var once sync.Once
	ingest.SetBeforeWrites(w.Ingest, func(context.Context) error {
		once.Do(func() {
			// Total 1500 -> 500: 500 of the allowance is free again.
			if _, err := w.Ingest.Correct(context.Background(), ingest.CorrectParams{UsageLogID: first, Key: "lower", Fingerprint: []byte("lower"),
				InputTokens: 500, Reason: "the provider's final count"}); err != nil {
				t.Errorf("correction: %v", err)
			}
		})
		return nil
	})
	second := worktest.Record(t, w.Ingest, tenant, ts, 300, 0) // total 800: inside the allowance
	ingest.SetBeforeWrites(w.Ingest, nil)

	var over, periodOver int64
	if err := w.Pool.QueryRow(context.Background(), `SELECT (SELECT coalesce(overage_input_tokens, input_tokens) FROM usage_logs WHERE id = $1),
			(SELECT sum(coalesce(overage_input_tokens, input_tokens)) FROM usage_logs WHERE tenant_id = $2)`, second, tenant).Scan(&over, &periodOver); err != nil {
		t.Fatal(err)
	}
	if over != 0 || periodOver != 0 {
		t.Fatalf("event after the correction charged %d, the period's overage %d; want 0 and 0 (total 800 against 1000 included)", over, periodOver)
	}
}

// seedLog records, outside ingest, a billed log of tenant in the period
// that began at period (its tokens in the period's total), for a
// correction of a period ingest no longer accepts events for.
func (b *bundle) seedLog(t *testing.T, tenant uuid.UUID, period time.Time, in int64) string {
	t.Helper()
	var id string
	if err := b.pool.QueryRow(context.Background(), `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status)
		VALUES (uuidv7(), $1, $2::timestamptz + interval '1 hour', 'u', 'm', $3, 0, $2, $3, 0, 'billed') RETURNING id::text`,
		tenant, period, in).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO allowance_usage AS a (tenant_id, period_start, slot, input_tokens, output_tokens)
		VALUES ($1, $2, 0, $3, 0) ON CONFLICT (tenant_id, period_start, slot) DO UPDATE SET input_tokens = a.input_tokens + EXCLUDED.input_tokens`,
		tenant, period, in); err != nil {
		t.Fatal(err)
	}
	return id
}

// A correction of a log whose billing period ended more than
// PERIOD_CLOSE_GRACE ago (its invoice may be final) needs ADMIN_TOKEN: the
// tenant's key gets 403 period-closed and nothing is recorded. Inside the
// grace the key may still correct it. Every correction records who made
// it — the key's id, or admin — shown in its answer and on the original's
// GET.
func TestCorrectionOfAClosedPeriodNeedsTheAdminToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// A calendar month that ended at least nine days ago.
	var month time.Time
	if err := b.pool.QueryRow(ctx, `SELECT date_trunc('month', now() - interval '40 days', 'UTC')`).Scan(&month); err != nil {
		t.Fatal(err)
	}
	old := b.seedLog(t, b.alice.ID, month, 100)
	p := requireProblem(t, b.correct(t, b.alice.APIKey, "fix-old", old, correction(60, 0, "recount")), http.StatusForbidden, "period-closed")
	if detail, _ := p["detail"].(string); !strings.Contains(detail, "ADMIN_TOKEN") {
		t.Fatalf("period-closed detail %q does not say who may correct it", detail)
	}
	if n := b.count(t, `SELECT count(*) FROM usage_logs WHERE corrects IS NOT NULL`); n != 0 {
		t.Fatalf("a refused correction recorded %d logs", n)
	}
	// The key was not spent on the refusal: the operator's answer is its own.
	admin := b.correct(t, adminToken, "fix-old", old, correction(60, 0, "recount"))
	requireStatus(t, admin, http.StatusAccepted)
	if m := admin.json(t); m["corrected_by"] != ingest.CorrectedByAdmin || m["stripe_timestamp"] != ingest.TimestampCorrection {
		t.Fatalf("the operator's correction %s, want corrected_by admin, timestamped now", admin.body)
	}

	// A log of the current period: the tenant's key corrects it, and the
	// correction names that key.
	cur := b.post(t, b.alice.APIKey, "k", event(70, 30)).json(t)["id"].(string)
	mine := b.correct(t, b.alice.APIKey, "fix-cur", cur, correction(50, 30, "recount"))
	requireStatus(t, mine, http.StatusAccepted)
	if by := mine.json(t)["corrected_by"]; by != b.alice.APIKeyID.String() {
		t.Fatalf("corrected_by %v, want the key id %s", by, b.alice.APIKeyID)
	}
	for id, want := range map[string]string{old: ingest.CorrectedByAdmin, cur: b.alice.APIKeyID.String()} {
		g := b.do(t, http.MethodGet, "/v1/usage-events/"+id, b.alice.APIKey, "", "").json(t)
		cs, _ := g["corrections"].([]any)
		if len(cs) != 1 || cs[0].(map[string]any)["corrected_by"] != want {
			t.Fatalf("GET %s: corrections %v, want one by %s", id, g["corrections"], want)
		}
		if _, ok := g["corrected_by"]; ok {
			t.Fatalf("GET %s: the original shows corrected_by: %v", id, g)
		}
		cid := cs[0].(map[string]any)["id"].(string)
		if c := b.do(t, http.MethodGet, "/v1/usage-events/"+cid, b.alice.APIKey, "", "").json(t); c["corrected_by"] != want {
			t.Fatalf("GET of the correction %s: %v, want corrected_by %s", cid, c, want)
		}
	}

	// A subscription period that ended 30 minutes ago is open for an hour
	// (PERIOD_CLOSE_GRACE's default); one that ended two hours ago is not.
	for _, c := range []struct {
		tenant *tenants.Created
		ended  time.Duration
		status int
	}{{b.bob, 30 * time.Minute, http.StatusAccepted}, {b.capped, 2 * time.Hour, http.StatusForbidden}} {
		var start time.Time
		if err := b.pool.QueryRow(ctx, `INSERT INTO tenant_subscriptions (tenant_id, stripe_subscription_id, status, current_period_start, current_period_end, event_created)
			VALUES ($1, 'sub_1', 'active', now() - interval '10 days', now() - make_interval(secs => $2), now()) RETURNING current_period_start`,
			c.tenant.ID, c.ended.Seconds()).Scan(&start); err != nil {
			t.Fatal(err)
		}
		id := b.seedLog(t, c.tenant.ID, start, 100)
		r := b.correct(t, c.tenant.APIKey, "fix-sub", id, correction(0, 0, "void"))
		if r.status != c.status {
			t.Fatalf("correction of a period that ended %s ago: %d %s, want %d", c.ended, r.status, r.body, c.status)
		}
	}
}
