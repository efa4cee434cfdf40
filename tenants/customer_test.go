package tenants_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/tenants"
)

// The reads and writes other packages make of tenants through this
// package: by Stripe customer (reconciliation, the webhooks), by name and
// customer (the demo), the report job's view, and the revocation of every
// key but one.
func TestTenantsByCustomerNameAndBilling(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	s := tenants.NewStore(pool)
	create := func(name, cus string) *tenants.Created {
		t.Helper()
		c, err := s.Create(ctx, tenants.CreateParams{Name: name, StripeCustomerID: cus})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a1, b, a2 := create("a1", "cus_a"), create("b", "cus_b"), create("a2", "cus_a")

	all, err := tenants.ByCustomer(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	// By customer, then id (v7: creation order).
	if got, want := fmt.Sprint(names(all)), "[a1/cus_a a2/cus_a b/cus_b]"; got != want {
		t.Errorf("ByCustomer(nil) = %s, want %s", got, want)
	}
	shared, err := tenants.ByCustomer(ctx, pool, &a2.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(names(shared)), "[a1/cus_a a2/cus_a]"; got != want {
		t.Errorf("ByCustomer(a2) = %s, want %s", got, want)
	}
	missing := uuid.New()
	if none, err := tenants.ByCustomer(ctx, pool, &missing); err != nil || len(none) != 0 {
		t.Errorf("ByCustomer(missing) = %v, %v; want none", none, err)
	}
	if n, err := tenants.CountOfCustomer(ctx, pool, "cus_a"); err != nil || n != 2 {
		t.Errorf("CountOfCustomer(cus_a) = %d, %v; want 2", n, err)
	}

	if id, ok, err := s.Find(ctx, "a1", "cus_a"); err != nil || !ok || id != a1.ID {
		t.Errorf("Find(a1, cus_a) = %s, %v, %v; want %s", id, ok, err, a1.ID)
	}
	if _, ok, err := s.Find(ctx, "a1", "cus_b"); err != nil || ok {
		t.Errorf("Find(a1, cus_b) = %v, %v; want none", ok, err)
	}

	n, err := tenants.SuspendCustomer(ctx, pool, "cus_a", time.Now(), "deleted")
	if err != nil || n != 2 {
		t.Fatalf("SuspendCustomer(cus_a) = %d, %v; want 2", n, err)
	}
	for _, c := range []struct {
		id        uuid.UUID
		customer  string
		suspended bool
	}{{a1.ID, "cus_a", true}, {b.ID, "cus_b", false}} {
		got, err := tenants.ReadBilling(ctx, pool, c.id)
		if err != nil || got.StripeCustomerID != c.customer || got.Suspended != c.suspended {
			t.Errorf("ReadBilling(%s) = %+v, %v; want %s suspended %v", c.id, got, err, c.customer, c.suspended)
		}
	}

	// Another key, then every key but it revoked: the first key no
	// longer authenticates, the new one does.
	k, err := s.AddKey(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeOtherKeys(ctx, b.ID, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, b.APIKey); err == nil {
		t.Error("the revoked first key still authenticates")
	}
	if p, err := s.Authenticate(ctx, k.Key); err != nil || p.TenantID != b.ID {
		t.Errorf("the kept key: %+v, %v", p, err)
	}
}

func names(ts []tenants.CustomerTenant) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Name + "/" + t.StripeCustomerID
	}
	return out
}
