package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
)

// reconcileExit runs reconcile in-process and returns its stdout and what
// main would print and exit with.
func reconcileExit(t *testing.T, env map[string]string, args ...string) (string, string, int) {
	t.Helper()
	out, _, err := runCmd(t, env, append([]string{"reconcile"}, args...)...)
	var stderr bytes.Buffer
	code := exitStatus(&stderr, err)
	if strings.Contains(stderr.String(), "reconcile: reconcile:") {
		t.Errorf("reconcile %v: a doubled prefix: %q", args, stderr.String())
	}
	return out, stderr.String(), code
}

func TestReconcileExitStatuses(t *testing.T) {
	t.Parallel()
	pool, dbURL := pgtest.NewPool(t)
	emu := emulator.New(emulator.Options{})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	env := map[string]string{"DATABASE_URL": dbURL, "STRIPE_SECRET_KEY": "sk_test_123", "STRIPE_API_BASE": base}
	now := time.Now().UTC()
	day := now.AddDate(0, 0, -3).Format("2006-01-02")
	yesterday := now.AddDate(0, 0, -1).Format("2006-01-02")
	today := now.Format("2006-01-02")

	// 0: nothing billed anywhere, and the days are settled.
	out, stderr, code := reconcileExit(t, env, "--from", day, "--to", day)
	if code != 0 || !strings.Contains(out, "OK: everything judged matches") {
		t.Fatalf("nothing billed anywhere: exit %d, %q\n%s", code, stderr, out)
	}

	tn, err := tenants.NewStore(pool).Create(context.Background(), tenants.CreateParams{Name: "acme", StripeCustomerID: "cus_recon"})
	if err != nil {
		t.Fatal(err)
	}
	// Billed in the database, never applied at Stripe: three days ago, and
	// yesterday a minute ago (activity inside the default settle time).
	if _, err := pool.Exec(context.Background(), `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status, first_attempt_at, input_accepted_at, billed_at, created_at)
		SELECT uuidv7(), $1, d::date + interval '12 hours', 'u', 'm', 70, 0, date_trunc('month', d::date), 70, 0, 'billed',
			now() - a, now() - a, now() - a, now() - a
		FROM (VALUES ($2::text, interval '3 days'), ($3::text, interval '1 minute')) v(d, a)`, tn.ID, day, yesterday); err != nil {
		t.Fatal(err)
	}

	// 1: a difference, named.
	out, stderr, code = reconcileExit(t, env, "--from", day, "--to", day)
	if code != 1 || !strings.Contains(stderr, "1 difference") {
		t.Fatalf("a difference: exit %d, %q\n%s", code, stderr, out)
	}
	for _, want := range []string{"cus_recon", "llm_input_tokens", day, "70", "DIFFERENT"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the report does not name %q:\n%s", want, out)
		}
	}

	// --settle-after 0s is honoured: yesterday's minute-old billing is too
	// recent under the default 2h (3: no verdict), judged (a difference)
	// under 0s.
	if out, stderr, code := reconcileExit(t, env, "--from", yesterday, "--to", yesterday); code != 3 || !strings.Contains(stderr, "nothing could be judged") {
		t.Fatalf("yesterday, default settle time: exit %d, %q\n%s", code, stderr, out)
	}
	if out, stderr, code := reconcileExit(t, env, "--from", yesterday, "--to", yesterday, "--settle-after", "0s"); code != 1 || !strings.Contains(out, "settle cutoff") || !strings.Contains(out, ", 0s before") {
		t.Fatalf("yesterday, --settle-after 0s: exit %d, %q\n%s", code, stderr, out)
	}

	// 2: usage and configuration errors, before anything is read.
	requests := len(emu.Requests())
	for name, tc := range map[string]struct {
		env  map[string]string
		args []string
		want string
	}{
		"no --from":         {env, []string{"--to", day}, "--from is required"},
		"no days":           {env, nil, "--to is required"},
		"a bad --from":      {env, []string{"--from", "yesterday", "--to", day}, "--from"},
		"from after to":     {env, []string{"--from", today, "--to", day}, "is after"},
		"negative settle":   {env, []string{"--from", day, "--to", day, "--settle-after", "-1s"}, "must not be negative"},
		"a bad --tenant":    {env, []string{"--from", day, "--to", day, "--tenant", "acme"}, "not a tenant id"},
		"no Stripe key":     {map[string]string{"DATABASE_URL": dbURL, "STRIPE_API_BASE": base}, []string{"--from", day, "--to", day}, "STRIPE_SECRET_KEY is required"},
		"a bad Stripe base": {map[string]string{"DATABASE_URL": dbURL, "STRIPE_SECRET_KEY": "sk_test_1", "STRIPE_API_BASE": "localhost"}, []string{"--from", day, "--to", day}, "STRIPE_API_BASE"},
	} {
		out, stderr, code := reconcileExit(t, tc.env, tc.args...)
		if code != 2 || out != "" || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want 2 and %q", name, code, out, stderr, tc.want)
		}
	}
	if len(emu.Requests()) != requests {
		t.Errorf("a usage error reached Stripe")
	}
	if out, stderr, code := reconcileExit(t, env, "--from", day, "--to", day, "--tenant", "0192f3a4-5b6c-7d8e-9f01-23456789abcd"); code != 2 || !strings.Contains(stderr, "not found") {
		t.Errorf("an unknown tenant: exit %d, %q\n%s", code, stderr, out)
	}

	// 3: Stripe does not answer, said in one line (no stripe-go log lines
	// before it).
	down := map[string]string{"DATABASE_URL": dbURL, "STRIPE_SECRET_KEY": "sk_test_123", "STRIPE_API_BASE": "http://127.0.0.1:1"}
	out, stderr, code = binary(t, down, "reconcile", "--from", day, "--to", day)
	if line := oneLine(t, "Stripe down", stderr); code != 3 || out != "" || !strings.HasPrefix(line, "overage: reconcile: ") || strings.Contains(line, "reconcile: reconcile:") {
		t.Errorf("Stripe down: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
}

func TestReconcileOfTodaySaysSoBeforeAnyVerdict(t *testing.T) {
	t.Parallel()
	_, dbURL := pgtest.NewPool(t)
	emu := emulator.New(emulator.Options{})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	env := map[string]string{"DATABASE_URL": dbURL, "STRIPE_SECRET_KEY": "sk_test_123", "STRIPE_API_BASE": base}
	now := time.Now().UTC()
	today := now.Format("2006-01-02")
	out, stderr, code := reconcileExit(t, env, "--from", today, "--to", today)
	if code != 3 || !strings.Contains(stderr, "nothing could be judged yet") || strings.Contains(out, "OK") || !strings.Contains(out, "NOT JUDGED") {
		t.Fatalf("reconcile of today: exit %d, %q\n%s", code, stderr, out)
	}
	out, stderr, code = reconcileExit(t, env, "--from", today, "--to", today, "--json")
	if code != 3 || !strings.Contains(stderr, "nothing could be judged yet") || !strings.HasPrefix(out, "{") || strings.Count(out, "\n") != 1 {
		t.Fatalf("reconcile --json of today: exit %d\nstdout %s\nstderr %s", code, out, stderr)
	}
	// A settled day and today: the OK line comes after the line saying
	// today is too recent.
	week := now.AddDate(0, 0, -7).Format("2006-01-02")
	out, stderr, code = reconcileExit(t, env, "--from", week, "--to", today, "--settle-after", "0s")
	recent, ok := strings.Index(out, "too recent to judge (")+1, strings.Index(out, "OK:")+1
	if code != 0 || stderr != "" || recent == 0 || ok == 0 || ok < recent || !strings.Contains(out, "every day from "+today) {
		t.Fatalf("a week to today: exit %d, %q\n%s", code, stderr, out)
	}
}
