package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
)

// `overage tenant update ID --stripe-customer CUS` of a suspended tenant
// asks Stripe (STRIPE_SECRET_KEY, STRIPE_API_BASE) for the customer: an
// unknown one is refused naming the flag, no Stripe credentials or no
// answer is refused saying so, and a customer Stripe knows lifts the
// suspension and queues the report job of the logs that waited.
func TestTenantUpdateLiftsASuspensionForACustomerStripeKnows(t *testing.T) {
	t.Parallel()
	pool, dbURL := pgtest.NewPool(t)
	ctx := context.Background()
	tn, err := tenants.NewStore(pool).Create(ctx, tenants.CreateParams{Name: "acme", StripeCustomerID: "cus_deleted"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE tenants SET suspended_at = now(), suspended_reason = 'Stripe customer deleted; tenant suspended' WHERE id = $1`, tn.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status)
		VALUES (uuidv7(), $1, now() - interval '1 minute', 'u', 'm', 10, 0, date_trunc('month', now(), 'UTC'), 10, 0, 'pending')`, tn.ID); err != nil {
		t.Fatal(err)
	}
	emu := emulator.New(emulator.Options{})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	emu.AddCustomer("cus_known")
	id := tn.ID.String()
	withStripe := map[string]string{"DATABASE_URL": dbURL, "STRIPE_SECRET_KEY": "sk_test_123", "STRIPE_API_BASE": base}
	suspended := func() bool {
		var s bool
		if err := pool.QueryRow(ctx, `SELECT suspended_at IS NOT NULL FROM tenants WHERE id = $1`, tn.ID).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	for _, c := range []struct {
		env  map[string]string
		cus  string
		want string
	}{
		{withStripe, "cus_unknown", "--stripe-customer Stripe has no customer cus_unknown"},
		{map[string]string{"DATABASE_URL": dbURL}, "cus_known", "STRIPE_SECRET_KEY is not configured"},
		{map[string]string{"DATABASE_URL": dbURL, "STRIPE_SECRET_KEY": "sk_test_123", "STRIPE_API_BASE": "http://127.0.0.1:1"}, "cus_known", "Stripe could not be asked"},
	} {
		_, _, err := runCmd(t, c.env, "tenant", "update", id, "--stripe-customer", c.cus)
		if err == nil || !strings.Contains(describe(err), c.want) {
			t.Fatalf("tenant update --stripe-customer %s: %v, want an error saying %q", c.cus, err, c.want)
		}
		if !suspended() {
			t.Fatal("a refused update lifted the suspension")
		}
	}

	out, _, err := runCmd(t, withStripe, "tenant", "update", id, "--stripe-customer", "cus_known")
	if err != nil {
		t.Fatal(err)
	}
	var shown map[string]any
	if err := json.Unmarshal([]byte(out), &shown); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if shown["stripe_customer_id"] != "cus_known" || shown["suspended_at"] != nil || suspended() {
		t.Fatalf("after the lift: %s", out)
	}
	var jobs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'overage.report_tenant' AND args->>'tenant_id' = $1`, id).Scan(&jobs); err != nil {
		t.Fatal(err)
	}
	if jobs != 1 {
		t.Fatalf("%d report jobs queued by the lift, want 1", jobs)
	}
}
