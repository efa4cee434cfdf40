package main

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage/internal/testkit/billingtest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

// TestDatabaseOutageUnderLoad cuts every PostgreSQL connection of a running
// `overage serve` and `overage work` (real child processes, through a TCP
// proxy) for OUTAGE_SECONDS (3 by default; `make chaos` runs 15) while
// events flood in and reports are in flight. During the cut ingest answers
// 503 with Retry-After, fast; afterwards both processes recover without a
// restart, every acknowledged event is recorded once, and Stripe holds
// exactly the overage PostgreSQL holds as billed — reports Stripe accepted
// while the worker could not commit were resent under their key and
// deduplicated by Stripe.
func TestDatabaseOutageUnderLoad(t *testing.T) {
	t.Parallel()
	outage := 3 * time.Second
	if v := os.Getenv("OUTAGE_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("OUTAGE_SECONDS=%q: %v", v, err)
		}
		outage = time.Duration(n) * time.Second
	}
	dbURL := pgtest.NewDatabase(t)
	w := newFaultWorld(t, dbURL)
	proxy, viaProxy := pgtest.NewProxy(t, dbURL)
	// Slow answers keep reports in flight at Stripe when the cut comes.
	emu := emulator.New(emulator.Options{Seed: 7, Faults: emulator.Faults{Latency: 150 * time.Millisecond}})
	stripeURL, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)

	poolSize := "&pool_max_conns=8" // small pools: two cores, parallel tests
	serve := startChild(t, "serve", "DATABASE_URL="+viaProxy+poolSize, "LISTEN_ADDR=127.0.0.1:0", "LOG_LEVEL=info")
	work := startChild(t, "work", "DATABASE_URL="+viaProxy+poolSize, "WORK_LISTEN_ADDR=127.0.0.1:0", "LOG_LEVEL=info",
		"STRIPE_SECRET_KEY=sk_test_123", "STRIPE_API_BASE="+stripeURL,
		"SWEEP_INTERVAL=1s", "SWEEP_GRACE=2s", "REPORT_JOB_TIMEOUT=3s", "REPORT_MAX_ATTEMPTS=5", "REPORT_WORKERS=8")
	ready := func(a string) bool {
		res, err := httpClient.Get("http://" + a + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}
	addr, workAddr := loggedAddr(t, serve.stderr, "serving"), loggedAddr(t, work.stderr, "work health and metrics")
	polltest.Until(t, "serve and work ready", 30*time.Second, func() bool { return ready(addr) && ready(workAddr) })

	fl := newFlood(addr, w.apiKey)
	fl.batchEvery = 4 // batches of five too
	stop := make(chan struct{})
	wg := fl.run(6, stop, 2*time.Minute, false)
	polltest.Until(t, "reports accepted by Stripe before the cut", time.Minute, func() bool { return len(emu.Events()) >= 20 })

	// Cut while a report is at Stripe (each is held there 150 ms), so its
	// acceptance cannot be committed and must be resent under its key.
	polltest.Until(t, "a report in flight at Stripe", time.Minute, func() bool { return emu.InFlight() > 0 })
	proxy.SetDown(true)
	cutAt := time.Now()
	polltest.Until(t, "503s during the cut", outage, func() bool {
		fl.mu.Lock()
		defer fl.mu.Unlock()
		return len(fl.unavailable) >= 5
	})
	time.Sleep(time.Until(cutAt.Add(outage)))
	if ready(addr) || ready(workAddr) {
		t.Fatal("ready while the database is unreachable")
	}
	proxy.SetDown(false)
	polltest.Until(t, "serve and work ready again, without a restart", time.Minute, func() bool { return ready(addr) && ready(workAddr) })
	polltest.Until(t, "events acknowledged after the cut", time.Minute, func() bool {
		fl.mu.Lock()
		defer fl.mu.Unlock()
		return len(fl.acked) >= int(fl.next.Load())/2+50
	})
	close(stop)
	wg.Wait()

	fl.mu.Lock()
	for _, a := range fl.unavailable {
		if a.retryAfter == "" || !strings.Contains(string(a.body), "service-unavailable") {
			t.Fatalf("a 503 without Retry-After or its problem type: %q %s", a.retryAfter, a.body)
		}
	}
	// A request during the cut fails at once (connection refused) or at
	// the pool's connect timeout (5 s), never later.
	if fl.worst > 8*time.Second {
		t.Fatalf("an ingest request took %s", fl.worst)
	}
	if fl.answers[http.StatusInternalServerError] > 0 {
		t.Fatalf("500s: %v", fl.answers)
	}
	t.Logf("answers %v, %d 503s, slowest %s, %d events acknowledged", fl.answers, len(fl.unavailable), fl.worst, len(fl.acked))
	acked := len(fl.acked)
	fl.mu.Unlock()
	if stored := fl.requireRecordedOnce(t, w); stored != acked {
		t.Fatalf("%d usage logs for %d acknowledged events", stored, acked)
	}

	polltest.Until(t, "every log billed", 3*time.Minute, func() bool {
		return w.count(t, "SELECT count(*) FROM usage_logs WHERE billing_status <> 'billed'") == 0
	})
	billingtest.RequireStripeMatchesBilled(t, w.pool, emu)
	// Some report reached Stripe during the cut, so its acceptance could not
	// be committed: it was sent again under the same key and Stripe answered
	// from its record instead of applying it twice.
	sends := map[string][]string{}
	for _, r := range emu.Requests() {
		if r.IdempotencyKey != "" {
			sends[r.IdempotencyKey] = append(sends[r.IdempotencyKey], r.Outcome)
		}
	}
	resent := 0
	for _, outcomes := range sends {
		if len(outcomes) > 1 && outcomes[0] == emulator.OutcomeApplied {
			resent++
		}
	}
	if resent == 0 {
		t.Fatalf("no report was resent after Stripe accepted it: the cut did not hit a report in flight (%d keys)", len(sends))
	}
	for name, c := range map[string]*child{"serve": serve, "work": work} {
		if gone, err := c.exited(); gone {
			t.Fatalf("%s exited during the outage: %v\n%s", name, err, tail(c.stderr.String(), 20))
		}
		if err, _ := c.stop(t, 30*time.Second); err != nil {
			t.Fatalf("%s did not stop cleanly: %v\n%s", name, err, tail(c.stderr.String(), 20))
		}
	}
	t.Logf("%d reports resent after a commit lost in the cut, all deduplicated", resent)
}
