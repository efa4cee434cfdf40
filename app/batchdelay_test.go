package app_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/syncbuf"
)

func claim(t *testing.T, dbURL, role string, d time.Duration) (*app.BatchDelayClaim, []app.OtherDelay) {
	t.Helper()
	c, others, err := app.ClaimBatchDelay(context.Background(), dbURL, role, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, others
}

// TestBatchDelayClaimsSeeTheLiveOthers: a process sees the delays of the
// live processes on its database that differ from its own, with their
// roles, and not those of processes that have ended or of another
// database.
func TestBatchDelayClaimsSeeTheLiveOthers(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	if _, others := claim(t, dbURL, "serve", time.Second); len(others) != 0 {
		t.Fatalf("the first process sees %v", others)
	}
	if _, others := claim(t, dbURL, "work", time.Second); len(others) != 0 {
		t.Fatalf("a work with serve's delay sees %v", others)
	}
	// Another database's processes are not this one's.
	if _, others := claim(t, pgtest.NewDatabase(t), "work", 5*time.Second); len(others) != 0 {
		t.Fatalf("a process of another database sees %v", others)
	}
	old, others := claim(t, dbURL, "work", 2*time.Second)
	want := []app.OtherDelay{{Role: "serve", Delay: time.Second}, {Role: "work", Delay: time.Second}}
	if !slices.Equal(others, want) {
		t.Fatalf("a work with 2s sees %v, want %v", others, want)
	}
	msg := app.BatchDelayMismatch("work", 2*time.Second, others)
	for _, s := range []string{"REPORT_BATCH_DELAY", "this work runs with 2s", "a serve process with 1s", "a work process with 1s"} {
		if !strings.Contains(msg, s) {
			t.Errorf("message %q lacks %q", msg, s)
		}
	}
	if app.BatchDelayMismatch("work", time.Second, nil) != "" {
		t.Error("a mismatch reported with no other process")
	}
	// Gone with its process: a serve with 1s now sees no one else's 2s.
	old.Close()
	polltest.Until(t, "the ended process's claim to go", 10*time.Second, func() bool {
		c, others, err := app.ClaimBatchDelay(context.Background(), dbURL, "serve", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		return len(others) == 0
	})
	if _, _, err := app.ClaimBatchDelay(context.Background(), dbURL, "cron", time.Second); err == nil {
		t.Error("an unknown role claimed a delay")
	}
}

// TestServeAndWorkCheckTheirBatchDelays: a work started with another
// REPORT_BATCH_DELAY than the serve running on its database logs an error
// naming both, and starts; one with the same delay logs none.
func TestServeAndWorkCheckTheirBatchDelays(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	env := map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0", "REPORT_BATCH_DELAY": "1s",
		"STRIPE_SECRET_KEY": "sk_test_batchdelay", "STRIPE_API_BASE": "http://127.0.0.1:1"}
	var sc app.ServeConfig
	if err := sc.Read(envOf(env)); err != nil {
		t.Fatal(err)
	}
	serveLog := &syncbuf.Buffer{}
	srv, err := app.NewServer(context.Background(), &sc, slog.New(slog.NewJSONHandler(serveLog, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		delay    string
		mismatch bool
	}{{"1s", false}, {"1500ms", true}} {
		env["REPORT_BATCH_DELAY"] = tc.delay
		var wc app.WorkConfig
		if err := wc.Read(envOf(env)); err != nil {
			t.Fatal(err)
		}
		logs := &syncbuf.Buffer{}
		w, err := app.NewWorker(context.Background(), &wc, slog.New(slog.NewJSONHandler(logs, nil)))
		if err != nil {
			t.Fatalf("work with REPORT_BATCH_DELAY=%s did not start: %v", tc.delay, err)
		}
		w.Close()
		logged := logs.String()
		got := strings.Contains(logged, `"level":"ERROR"`) && strings.Contains(logged, "REPORT_BATCH_DELAY disagrees: this work runs with 1.5s, but a serve process with 1s")
		if got != tc.mismatch || (!tc.mismatch && strings.Contains(logged, "REPORT_BATCH_DELAY")) {
			t.Errorf("work with REPORT_BATCH_DELAY=%s beside a serve with 1s logged:\n%s", tc.delay, logged)
		}
	}
	if strings.Contains(serveLog.String(), "REPORT_BATCH_DELAY") {
		t.Errorf("the first process logged a mismatch:\n%s", serveLog)
	}
}
