package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage/internal/testkit/billingtest"
	"github.com/overage-billing/overage/internal/testkit/metricstest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

// TestStripeDownForHours scales Stripe's 24-hour idempotency window to 10 s
// (STRIPE_IDEMPOTENCY_WINDOW) and takes Stripe down (every call 500) for
// longer than every REPORT_MAX_ATTEMPTS backoff. Throughout, the metrics
// and `overage status` show the backlog and its age. After recovery,
// everything first sent inside the window is billed with Stripe equal to
// PostgreSQL, and what was first sent before the window closed is in
// needs_review and was not sent again.
func TestStripeDownForHours(t *testing.T) {
	t.Parallel()
	const window = 10 * time.Second
	dbURL := pgtest.NewDatabase(t)
	w := newFaultWorld(t, dbURL)
	srv := startServerOn(t, dbURL+"&pool_max_conns=4")
	fl := newFlood(srv.Addr(), w.apiKey)
	ingest := func(from, to int) {
		for i := from; i < to; i++ {
			fl.one(i, 10*time.Second, false)
		}
		if len(fl.errs) > 0 {
			t.Fatal(fl.errs[0])
		}
	}
	ingest(0, 10) // early: first sent while Stripe is down, past the window at recovery

	emu := emulator.New(emulator.Options{Seed: 5, Faults: emulator.Faults{ServerErrorRate: 1}})
	stripeURL, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	work := startChild(t, "work", "DATABASE_URL="+dbURL+"&pool_max_conns=10", "WORK_LISTEN_ADDR=127.0.0.1:0", "LOG_LEVEL=info",
		"STRIPE_SECRET_KEY=sk_test_123", "STRIPE_API_BASE="+stripeURL, "STRIPE_IDEMPOTENCY_WINDOW="+window.String(),
		"SWEEP_INTERVAL=1s", "SWEEP_GRACE=1s", "REPORT_JOB_TIMEOUT=3s", "REPORT_MAX_ATTEMPTS=2", "REPORT_WORKERS=8")
	workAddr := loggedAddr(t, work.stderr, "work health and metrics")
	metric := func(name string) string {
		v, _ := metricstest.Value(httpClient, "http://"+workAddr+"/metrics", name)
		return v
	}
	polltest.Until(t, "every early log tried", 30*time.Second, func() bool {
		return w.count(t, "SELECT count(*) FROM usage_logs WHERE first_attempt_at IS NULL") == 0
	})
	tried := time.Now()
	for _, wait := range []time.Duration{0, 3 * time.Second} {
		time.Sleep(wait)
		if v := metric("overage_pending_usage_logs"); v != "10" {
			t.Fatalf("overage_pending_usage_logs = %q during the outage, want 10", v)
		}
		if v := metric("overage_oldest_pending_age_seconds"); v == "" || v == "0" {
			t.Fatalf("overage_oldest_pending_age_seconds = %q during the outage", v)
		}
		out, _, err := runCmd(t, map[string]string{"DATABASE_URL": dbURL}, "status", "--json")
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Totals struct {
				Pending         int        `json:"pending"`
				OldestPendingAt *time.Time `json:"oldest_pending_at"`
			} `json:"totals"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil || st.Totals.Pending+w.count(t, "SELECT count(*) FROM usage_logs WHERE billing_status = 'needs_review'") != 10 || st.Totals.OldestPendingAt == nil {
			t.Fatalf("overage status during the outage: %s (%v)", out, err)
		}
	}
	time.Sleep(time.Until(tried.Add(window - 2*time.Second)))
	ingest(10, 20) // late: well inside the window at recovery
	time.Sleep(time.Until(tried.Add(window)))
	// Stripe answered every call with a 500, so nothing may be billed or
	// accepted yet: a worker that took a refusal for an acceptance shows
	// here (the emulator applying nothing is its own guarantee, not ours).
	if n := w.count(t, "SELECT count(*) FROM usage_logs WHERE billing_status = 'billed' OR input_accepted_at IS NOT NULL OR output_accepted_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d usage logs billed or accepted while Stripe answered only 500s", n)
	}
	if n := w.count(t, "SELECT count(*) FROM usage_reports WHERE state = 'accepted'"); n != 0 {
		t.Fatalf("%d reports accepted while Stripe answered only 500s", n)
	}
	recovered := time.Now()
	emu.SetFaults(emulator.Faults{})

	polltest.Until(t, "every log billed or in review", time.Minute, func() bool {
		return w.count(t, "SELECT count(*) FROM usage_logs WHERE billing_status NOT IN ('billed', 'needs_review')") == 0
	})
	var late []string
	for i := 10; i < 20; i++ {
		late = append(late, fmt.Sprintf("req-%d", i))
	}
	if n := w.count(t, `SELECT count(*) FROM usage_logs WHERE request_id = ANY($1) AND billing_status <> 'billed'`, late); n != 0 {
		rows, _ := w.pool.Query(t.Context(), `SELECT request_id || ' ' || billing_status || ' first sent ' || coalesce(first_attempt_at::text, '-') || ' created ' || created_at::text FROM usage_logs ORDER BY created_at`)
		var all []string
		for rows.Next() {
			var s string
			_ = rows.Scan(&s)
			all = append(all, s)
		}
		rows.Close()
		t.Fatalf("%d logs first sent inside the window not billed (recovered at %s):\n%s", n, recovered.UTC(), strings.Join(all, "\n"))
	}
	review := w.count(t, "SELECT count(*) FROM usage_logs WHERE billing_status = 'needs_review'")
	if review == 0 {
		t.Fatal("no log in needs_review: the window was not enforced")
	}
	// A log in review was not sent after its window closed.
	rows, err := w.pool.Query(t.Context(), `SELECT id::text FROM usage_logs WHERE billing_status = 'needs_review'`)
	if err != nil {
		t.Fatal(err)
	}
	parked := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		parked[id] = true
	}
	rows.Close()
	for _, r := range emu.Requests() {
		for id := range parked {
			if strings.Contains(r.Identifier, id) && r.ReceivedAt.After(recovered) {
				t.Fatalf("log %s in needs_review was sent after recovery (%s)", id, r.Outcome)
			}
		}
	}
	billingtest.RequireStripeMatchesBilled(t, w.pool, emu)
	// The outage outlasted every attempt of a job: a log was sent more than
	// REPORT_MAX_ATTEMPTS times, so the sweep queued it again — and every
	// send of one meter event carried the same key.
	keys, sends := map[string]map[string]bool{}, map[string]int{}
	for _, r := range emu.Requests() {
		if r.Identifier == "" {
			continue
		}
		if keys[r.Identifier] == nil {
			keys[r.Identifier] = map[string]bool{}
		}
		keys[r.Identifier][r.IdempotencyKey] = true
		sends[r.Identifier]++
	}
	most := 0
	for id, k := range keys {
		if len(k) != 1 {
			t.Fatalf("meter event %s sent under %d keys", id, len(k))
		}
		most = max(most, sends[id])
	}
	if most <= 2 {
		t.Fatalf("no meter event sent more than REPORT_MAX_ATTEMPTS (2) times: the outage did not outlast a job's attempts")
	}
	if v := metric("overage_needs_review_usage_logs"); v == "" || v == "0" {
		t.Fatalf("overage_needs_review_usage_logs = %q", v)
	}
	if gone, err := work.exited(); gone {
		t.Fatalf("work exited: %v", err)
	}
	t.Logf("%d logs in needs_review, %d billed after the outage; a meter event sent at most %d times", review,
		w.count(t, "SELECT count(*) FROM usage_logs WHERE billing_status = 'billed'"), most)
}
