package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/internal/testkit/billingtest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

// SIGTERM to `overage serve` in the middle of a flood of events: it exits 0
// within its grace period, every event answered 2xx is committed under the
// usage log id it was answered with, and no log is half-written.
func TestServeShutdownUnderLoad(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	w := newFaultWorld(t, dbURL)
	serve := startChild(t, "serve", "DATABASE_URL="+dbURL+"&pool_max_conns=8", "LISTEN_ADDR=127.0.0.1:0", "LOG_LEVEL=info")
	addr := loggedAddr(t, serve.stderr, "serving")
	polltest.Until(t, "serve ready", 30*time.Second, func() bool {
		res, err := httpClient.Get("http://" + addr + "/readyz")
		if err == nil {
			res.Body.Close()
		}
		return err == nil && res.StatusCode == http.StatusOK
	})

	fl := newFlood(addr, w.apiKey)
	fl.batchEvery = 4 // batches of five too
	stop := make(chan struct{})
	wg := fl.run(8, stop, 10*time.Second, true)
	polltest.Until(t, "events flowing", 30*time.Second, func() bool {
		fl.mu.Lock()
		defer fl.mu.Unlock()
		return len(fl.acked) >= 100
	})
	err, took := serve.stop(t, app.ShutdownTimeout+5*time.Second)
	if err != nil {
		t.Fatalf("serve exited with %v after SIGTERM\n%s", err, tail(serve.stderr.String(), 20))
	}
	if took > app.ShutdownTimeout {
		t.Fatalf("serve took %s to stop, over its grace period %s", took, app.ShutdownTimeout)
	}
	close(stop)
	wg.Wait()
	stored := fl.requireRecordedOnce(t, w)
	t.Logf("serve stopped in %s; %d events acknowledged, %d stored, answers %v", took, len(fl.acked), stored, fl.answers)
}

// SIGTERM to `overage work` while reports wait on a slow Stripe: it exits 0
// within its grace period, and a new worker finishes the rest with Stripe
// holding exactly the billed overage — a report sent before the stop is
// never applied twice.
func TestWorkShutdownWithReportsInFlight(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	w := newFaultWorld(t, dbURL)
	srv := startServerOn(t, dbURL+"&pool_max_conns=4")
	fl := newFlood(srv.Addr(), w.apiKey)
	for i := range 60 {
		fl.one(i, 10*time.Second, false)
	}
	if len(fl.errs) > 0 {
		t.Fatal(fl.errs[0])
	}

	emu := emulator.New(emulator.Options{Seed: 3, Faults: emulator.Faults{Latency: 100 * time.Millisecond}})
	stripeURL, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	env := []string{"DATABASE_URL=" + dbURL + "&pool_max_conns=10", "STRIPE_SECRET_KEY=sk_test_123", "STRIPE_API_BASE=" + stripeURL,
		"SWEEP_INTERVAL=1s", "SWEEP_GRACE=2s", "REPORT_JOB_TIMEOUT=5s", "REPORT_WORKERS=8",
		// Small reports, so several are in flight when the stop comes.
		"REPORT_BATCH_MAX=5"}
	work := startChild(t, "work", env...)
	// Stop once some logs are billed and more reports are still at Stripe.
	// Events applied are not enough: a log with overage on both meters is
	// billed only when both its reports are accepted, so four applied
	// events can leave every log still pending.
	polltest.Until(t, "logs billed and reports in flight at Stripe", time.Minute, func() bool {
		return len(emu.Events()) >= 4 && emu.InFlight() > 0 &&
			w.count(t, "SELECT count(*) FROM usage_logs WHERE billing_status = 'billed'") > 0
	})
	err, took := work.stop(t, time.Minute)
	if err != nil {
		t.Fatalf("work exited with %v after SIGTERM\n%s", err, tail(work.stderr.String(), 20))
	}
	// River's stop timeout (20 s) and the cancel after it (10 s).
	if took > 30*time.Second {
		t.Fatalf("work took %s to stop", took)
	}
	billedAtStop := w.count(t, "SELECT count(*) FROM usage_logs WHERE billing_status = 'billed'")
	if billedAtStop == 0 || billedAtStop == 60 {
		t.Fatalf("%d of 60 logs billed at the stop: no report was in flight", billedAtStop)
	}
	appliedAtStop := len(emu.Events())
	t.Logf("work stopped in %s: %d logs billed, Stripe had applied %d meter events", took, billedAtStop, appliedAtStop)

	startChild(t, "work", env...)
	polltest.Until(t, "every log billed by the next worker", 2*time.Minute, func() bool {
		return w.count(t, "SELECT count(*) FROM usage_logs WHERE billing_status <> 'billed'") == 0
	})
	billingtest.RequireStripeMatchesBilled(t, w.pool, emu)
	t.Logf("work stopped in %s with %d of 60 logs billed; the next worker billed the rest", took, billedAtStop)
}
