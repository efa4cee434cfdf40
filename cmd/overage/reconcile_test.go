package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage/internal/pgtest"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
)

func TestReconcileExitsNonZeroOnADifference(t *testing.T) {
	t.Parallel()
	pool, dbURL := pgtest.NewPool(t)
	emu := emulator.New(emulator.Options{})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	env := map[string]string{"DATABASE_URL": dbURL, "STRIPE_SECRET_KEY": "sk_test_123", "STRIPE_API_BASE": base}
	day := time.Now().UTC().AddDate(0, 0, -3).Format("2006-01-02")

	out, _, err := runCmd(t, env, "reconcile", "--from", day, "--to", day)
	if err != nil {
		t.Fatalf("nothing billed anywhere: %v\n%s", err, out)
	}

	tn, err := tenants.NewStore(pool).Create(context.Background(), tenants.CreateParams{Name: "acme", StripeCustomerID: "cus_recon"})
	if err != nil {
		t.Fatal(err)
	}
	// Billed in the database three days ago, never applied at Stripe.
	if _, err := pool.Exec(context.Background(), `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status, first_attempt_at, input_accepted_at, billed_at, created_at)
		VALUES (gen_random_uuid(), $1, $2::date + interval '12 hours', 'u', 'm', 70, 0, date_trunc('month', $2::date), 70, 0, 'billed',
			now() - interval '3 days', now() - interval '3 days', now() - interval '3 days', now() - interval '3 days')`, tn.ID, day); err != nil {
		t.Fatal(err)
	}
	out, _, err = runCmd(t, env, "reconcile", "--from", day, "--to", day)
	if err == nil || !strings.Contains(err.Error(), "1 difference") {
		t.Fatalf("err = %v, want one difference\n%s", err, out)
	}
	for _, want := range []string{"cus_recon", "llm_input_tokens", day, "70"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the report does not name %q:\n%s", want, out)
		}
	}
	if _, _, err := runCmd(t, env, "reconcile", "--from", "yesterday", "--to", day); err == nil || !strings.Contains(err.Error(), "--from") {
		t.Fatalf("a bad --from: %v", err)
	}
}
