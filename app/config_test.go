package app_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/ingest"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestConfigRefusesUnsafeLimits: a window Stripe does not keep, an
// admin token too short to be a secret and a tenant limit that is not a
// positive integer are startup errors naming their variable, and the
// token's value is never in the message.
func TestConfigRefusesUnsafeLimits(t *testing.T) {
	t.Parallel()
	const shortToken = "short-admin-token-31-characters"
	if len(shortToken) != app.MinAdminTokenLen-1 {
		t.Fatalf("test token is %d characters", len(shortToken))
	}
	for _, tc := range []struct {
		name, value string
		cfg         app.Settings
	}{
		{"STRIPE_IDEMPOTENCY_WINDOW", "25h", &app.WindowConfig{}},
		{"STRIPE_IDEMPOTENCY_WINDOW", "24h0m1s", &app.WorkConfig{}},
		{"ADMIN_TOKEN", shortToken, &app.ServeConfig{}},
		{"ADMIN_TOKEN", "q7Zk", &app.ServeConfig{}},
		{"TENANT_MAX_INFLIGHT", "0", &app.ServeConfig{}},
		{"TENANT_MAX_INFLIGHT", "eight", &app.ServeConfig{}},
		{"PERIOD_CLOSE_GRACE", "an hour", &app.IngestConfig{}},
		{"PERIOD_CLOSE_GRACE", "-1h", &app.WorkConfig{}},
	} {
		err := app.Read(envOf(map[string]string{tc.name: tc.value}), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s=%q: error %v, want one naming %s", tc.name, tc.value, err, tc.name)
			continue
		}
		if tc.name == "ADMIN_TOKEN" && strings.Contains(err.Error(), tc.value) {
			t.Errorf("ADMIN_TOKEN's value in the error: %v", err)
		}
	}
	for _, tc := range []struct {
		env  map[string]string
		want func(*app.ServeConfig, *app.WorkConfig) bool
	}{
		{map[string]string{"STRIPE_IDEMPOTENCY_WINDOW": "24h"}, func(_ *app.ServeConfig, c *app.WorkConfig) bool { return c.Window.IdempotencyWindow == 24*time.Hour }},
		{map[string]string{"STRIPE_IDEMPOTENCY_WINDOW": "1h"}, func(_ *app.ServeConfig, c *app.WorkConfig) bool { return c.Window.IdempotencyWindow == time.Hour }},
		{map[string]string{"ADMIN_TOKEN": shortToken + "x"}, func(c *app.ServeConfig, _ *app.WorkConfig) bool { return c.AdminToken == shortToken+"x" }},
		{map[string]string{}, func(c *app.ServeConfig, w *app.WorkConfig) bool {
			return c.AdminToken == "" && c.TenantMaxInflight == ingest.DefaultTenantMaxInflight && c.Ingest.PeriodCloseGrace == time.Hour &&
				w.PeriodCloseGrace == time.Hour
		}},
		{map[string]string{"PERIOD_CLOSE_GRACE": "30m"}, func(c *app.ServeConfig, w *app.WorkConfig) bool {
			return c.Ingest.PeriodCloseGrace == 30*time.Minute && w.PeriodCloseGrace == 30*time.Minute
		}},
		{map[string]string{"TENANT_MAX_INFLIGHT": "3"}, func(c *app.ServeConfig, _ *app.WorkConfig) bool { return c.TenantMaxInflight == 3 }},
	} {
		var s app.ServeConfig
		var w app.WorkConfig
		if err := app.Read(envOf(tc.env), &s, &w); err != nil || !tc.want(&s, &w) {
			t.Errorf("%v: %+v %+v, %v", tc.env, s, w, err)
		}
	}
}

// TestConfigErrorsNameTheVariable: every malformed variable the parts
// read is in one error of one line, each once however many parts read it.
func TestConfigErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	env := envOf(map[string]string{"SWEEP_INTERVAL": "ten minutes", "REPORT_MAX_ATTEMPTS": "-1", "STRIPE_API_BASE": "localhost",
		"STREAM_IDLE_TIMEOUT": "an hour", "INGEST_COALESCE": "-1", "LOG_LEVEL": "loud"})
	var dev app.DevConfig
	err := app.Read(env, &dev)
	if err == nil {
		t.Fatal("malformed configuration accepted")
	}
	for _, name := range []string{"SWEEP_INTERVAL", "REPORT_MAX_ATTEMPTS", "STRIPE_API_BASE", "STREAM_IDLE_TIMEOUT", "INGEST_COALESCE", "LOG_LEVEL"} {
		if n := strings.Count(err.Error(), name+"="); n != 1 {
			t.Errorf("error %q names %s %d times, want once", err, name, n)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is not one line: %q", err)
	}
	// INGEST_COALESCE: unset keeps the default, 0 turns group commit off.
	for v, want := range map[string]int{"": ingest.DefaultGroupsInFlight, "0": 0, "3": 3} {
		var c app.IngestConfig
		if err := c.Read(envOf(map[string]string{"INGEST_COALESCE": v})); err != nil || c.Coalesce != want {
			t.Errorf("INGEST_COALESCE=%q: Coalesce %d (%v), want %d", v, c.Coalesce, err, want)
		}
	}
}

// TestEachRoleReadsOnlyItsVariables: a malformed variable a role does not
// hold is not looked at; one it holds is reported.
func TestEachRoleReadsOnlyItsVariables(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		role            string
		cfg             func() app.Settings
		reads, notReads string
	}{
		{"db", func() app.Settings { return &app.DBConfig{} }, "", "REPORT_BATCH_DELAY"},
		{"report", func() app.Settings { return &app.ReportConfig{} }, "REPORT_BATCH_DELAY", "SWEEP_GRACE"},
		{"stripe", func() app.Settings { return &app.StripeConfig{} }, "STRIPE_API_BASE", "STRIPE_RATE_LIMIT"},
		{"log", func() app.Settings { return &app.LogConfig{} }, "LOG_LEVEL", "REPORT_BATCH_DELAY"},
		{"window", func() app.Settings { return &app.WindowConfig{} }, "STRIPE_IDEMPOTENCY_WINDOW", "REPORT_BATCH_DELAY"},
		{"ingest", func() app.Settings { return &app.IngestConfig{} }, "REPORT_BATCH_DELAY", "TENANT_MAX_INFLIGHT"},
		{"serve", func() app.Settings { return &app.ServeConfig{} }, "TENANT_MAX_INFLIGHT", "REPORT_WORKERS"},
		{"serve", func() app.Settings { return &app.ServeConfig{} }, "REPORT_BATCH_DELAY", "SWEEP_GRACE"},
		{"work", func() app.Settings { return &app.WorkConfig{} }, "SWEEP_GRACE", "TENANT_MAX_INFLIGHT"},
		{"work", func() app.Settings { return &app.WorkConfig{} }, "REPORT_BATCH_DELAY", "INGEST_COALESCE"},
	} {
		malformed := map[string]string{"REPORT_BATCH_DELAY": "1 second", "SWEEP_GRACE": "soon", "STRIPE_API_BASE": "api.stripe.com",
			"STRIPE_RATE_LIMIT": "fast", "LOG_LEVEL": "loud", "STRIPE_IDEMPOTENCY_WINDOW": "2d", "TENANT_MAX_INFLIGHT": "-8",
			"REPORT_WORKERS": "many", "INGEST_COALESCE": "yes"}
		if tc.reads != "" {
			err := app.Read(envOf(map[string]string{tc.reads: malformed[tc.reads]}), tc.cfg())
			if err == nil || !strings.Contains(err.Error(), tc.reads+"=") {
				t.Errorf("%s with %s=%q: %v, want an error naming it", tc.role, tc.reads, malformed[tc.reads], err)
			}
		}
		if err := app.Read(envOf(map[string]string{tc.notReads: malformed[tc.notReads]}), tc.cfg()); err != nil {
			t.Errorf("%s with %s=%q, which it does not hold: %v", tc.role, tc.notReads, malformed[tc.notReads], err)
		}
	}
}

// TestDefaultsAreTheTable's: with an empty environment each role holds
// the table's defaults, and a Source's own defaults come before the
// table's but after the environment.
func TestDefaultsAreTheTables(t *testing.T) {
	t.Parallel()
	var dev app.DevConfig
	if err := app.Read(envOf(nil), &dev); err != nil {
		t.Fatal(err)
	}
	def := map[string]string{}
	for _, v := range app.Vars() {
		def[v.Name] = v.Default
	}
	for name, got := range map[string]string{
		"DATABASE_URL": dev.Serve.DB.URL, "LISTEN_ADDR": dev.Serve.ListenAddr, "STRIPE_API_BASE": dev.Work.Stripe.APIBase,
		"SWEEP_GRACE": dev.Work.SweepGrace.String(), "REPORT_BATCH_DELAY": dev.Serve.Ingest.Report.BatchDelay.String(),
		"REPORT_JOB_TIMEOUT": dev.Work.JobTimeout.String(), "STRIPE_IDEMPOTENCY_WINDOW": dev.Work.Window.IdempotencyWindow.String(),
		"LOG_LEVEL": strings.ToLower(dev.Serve.Log.Level.String()),
	} {
		want := def[name]
		if d, err := time.ParseDuration(want); err == nil {
			want = d.String()
		}
		if got != want {
			t.Errorf("%s: %q, want the table's %q", name, got, want)
		}
	}
	if dev.Work.Report != dev.Serve.Ingest.Report {
		t.Errorf("serve's report settings %+v and work's %+v differ on one environment", dev.Serve.Ingest.Report, dev.Work.Report)
	}

	src := app.Source{Getenv: envOf(map[string]string{"SWEEP_GRACE": "1m"}), Defaults: map[string]string{"SWEEP_GRACE": "2s", "REPORT_JOB_TIMEOUT": "10s"}}
	var w app.WorkConfig
	if err := src.Read(&w); err != nil || w.SweepGrace != time.Minute || w.JobTimeout != 10*time.Second {
		t.Errorf("SWEEP_GRACE %s (want the environment's 1m), REPORT_JOB_TIMEOUT %s (want the source's 10s): %v", w.SweepGrace, w.JobTimeout, err)
	}
	defer func() {
		if recover() == nil {
			t.Error("a default for a variable outside the table was accepted")
		}
	}()
	_ = app.Source{Getenv: envOf(nil), Defaults: map[string]string{"SWEEP_GRAC": "2s"}}.Read(&w)
}

// TestNamesAreWhatARoleReads: Names lists each variable a role reads once.
func TestNamesAreWhatARoleReads(t *testing.T) {
	t.Parallel()
	names := app.Names(&app.ServeConfig{}, &app.WorkConfig{})
	all := app.Vars()
	if len(names) != len(all) {
		t.Errorf("serve and work read %d variables %v, the table has %d", len(names), names, len(all))
	}
	if got := app.Names(&app.ReportConfig{}); !slices.Equal(got, []string{"REPORT_MAX_ATTEMPTS", "REPORT_BATCH_DELAY"}) {
		t.Errorf("ReportConfig reads %v", got)
	}
}
