package stripeclient_test

import (
	"context"
	"testing"
	"time"

	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/customer"

	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

// CustomerExists is GET /v1/customers/{id} through stripe-go, against the
// emulator: a customer it was told of, created or billed exists; an
// unknown one (404 resource_missing) and a deleted one ("deleted": true)
// do not; no answer is an error, not a "no".
func TestCustomerExists(t *testing.T) {
	t.Parallel()
	emu := emulator.New(emulator.Options{Seed: 1})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	c, err := stripeclient.New(stripeclient.Config{SecretKey: secretKey, APIBase: base})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	exists := func(id string) bool {
		t.Helper()
		ok, err := c.CustomerExists(ctx, id)
		if err != nil {
			t.Fatalf("CustomerExists(%s): %v", id, err)
		}
		return ok
	}
	if exists("cus_unknown") {
		t.Fatal("an unknown customer exists")
	}
	emu.AddCustomer("cus_told")
	if _, err := c.SendMeterEvent(ctx, event("cus_billed", "k-billed")); err != nil {
		t.Fatal(err)
	}
	// Created through stripe-go, as an operator's script would.
	created, err := (&customer.Client{B: stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{URL: stripe.String(base)}), Key: secretKey}).
		New(&stripe.CustomerParams{Name: stripe.String("Acme")})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"cus_told", "cus_billed", created.ID} {
		if !exists(id) {
			t.Fatalf("customer %s does not exist", id)
		}
	}
	emu.DeleteCustomer("cus_told")
	if exists("cus_told") {
		t.Fatal("a deleted customer exists")
	}
	// A meter event for the deleted customer is refused as Stripe would.
	if _, err := c.SendMeterEvent(ctx, event("cus_told", "k-deleted")); !stripeclient.IsPermanent(err) {
		t.Fatalf("meter event for a deleted customer: %v, want a permanent error", err)
	}

	emu.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if ok, err := c.CustomerExists(cctx, created.ID); err == nil {
		t.Fatalf("Stripe unreachable: %v, nil; want an error", ok)
	}
}
