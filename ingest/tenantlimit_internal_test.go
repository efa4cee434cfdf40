package ingest

import (
	"testing"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
)

// TestTenantLimiter: a tenant's requests past max are refused with
// tenant-busy and Retry-After, other tenants are not; coalesced single
// events take at most coalesce slots however many are in execution; a
// released slot is free again, and a tenant with nothing in execution is
// forgotten.
func TestTenantLimiter(t *testing.T) {
	t.Parallel()
	l := newTenantLimiter(3)
	a, b := uuid.New(), uuid.New()
	const coalesce = 1
	var releases []func()
	take := func(tenant uuid.UUID, single bool, c int) error {
		t.Helper()
		rel, err := l.admit(tenant, single, c)
		if err == nil {
			releases = append(releases, rel)
		}
		return err
	}
	for i := range 3 {
		if err := take(a, false, coalesce); err != nil {
			t.Fatalf("request %d of 3: %v", i+1, err)
		}
	}
	err := take(a, false, coalesce)
	e := overage.AsError(err)
	if err == nil || e.Code != overage.EBUSY || e.Type != "tenant-busy" || e.RetryAfter <= 0 {
		t.Fatalf("a 4th request: %v, want tenant-busy with Retry-After", err)
	}
	if err := take(a, true, coalesce); err == nil {
		t.Fatal("a single event past the limit admitted")
	}
	if err := take(b, false, coalesce); err != nil {
		t.Fatalf("another tenant refused: %v", err)
	}
	releases[0]()
	releases[0]() // a second release frees nothing more
	if err := take(a, true, coalesce); err != nil {
		t.Fatalf("a single event in a freed slot: %v", err)
	}
	// Coalesced: more single events ride in the group's slot.
	for i := range 20 {
		if err := take(a, true, coalesce); err != nil {
			t.Fatalf("coalesced single event %d: %v", i, err)
		}
	}
	if err := take(a, false, coalesce); err == nil {
		t.Fatal("a batch admitted past the limit while singles hold a slot")
	}
	// Without coalescing each single event takes a slot of its own.
	c := uuid.New()
	for i := range 3 {
		if err := take(c, true, 0); err != nil {
			t.Fatalf("uncoalesced single %d: %v", i, err)
		}
	}
	if err := take(c, true, 0); err == nil {
		t.Fatal("a 4th uncoalesced single event admitted")
	}
	for _, r := range releases {
		r()
	}
	if n := len(l.tenants); n != 0 {
		t.Fatalf("%d tenants remembered with nothing in execution", n)
	}
}
