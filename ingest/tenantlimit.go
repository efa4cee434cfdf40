package ingest

import (
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
)

// DefaultTenantMaxInflight is TENANT_MAX_INFLIGHT's default.
const DefaultTenantMaxInflight = 8

// TenantBusyRetryAfter is the Retry-After of a 429 tenant-busy: a
// tenant's requests in execution take milliseconds to a few hundred.
const TenantBusyRetryAfter = time.Second

// tenantLimiter is fair share between tenants: at most max requests of
// one tenant execute at once in this process; beyond, 429 tenant-busy at
// once, with nothing recorded, so one tenant's flood cannot take every
// connection of the pool and make everyone else wait out their deadline.
//
// Single usage events that the service coalesces (coalesce > 0 groups of
// a tenant in flight, INGEST_COALESCE, the service's setting) count as the groups they make: the
// tenant's single events in execution take min(n, coalesce) slots, not n,
// since past coalesce they wait in the tenant's pending list and share
// one transaction. Every other request (a batch, a checkpoint, a
// correction, a read) takes one slot.
type tenantLimiter struct {
	max int

	mu      sync.Mutex
	tenants map[uuid.UUID]*tenantLoad
}

// tenantLoad is one tenant's requests in execution; it exists while any
// runs.
type tenantLoad struct {
	singles int // coalescable single events
	others  int
}

func newTenantLimiter(max int) *tenantLimiter {
	if max <= 0 {
		max = DefaultTenantMaxInflight
	}
	return &tenantLimiter{max: max, tenants: map[uuid.UUID]*tenantLoad{}}
}

// slots is how many slots t takes when the service runs coalesce groups
// of a tenant at once (0: no coalescing).
func slots(t *tenantLoad, coalesce int) int {
	s := t.singles
	if coalesce > 0 {
		s = min(s, coalesce)
	}
	return t.others + s
}

// admit takes a slot of tenant for a request, a coalescable single event
// or not, and returns its release; past the limit it returns the 429.
func (l *tenantLimiter) admit(tenant uuid.UUID, single bool, coalesce int) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.tenants[tenant]
	if t == nil {
		t = &tenantLoad{}
		l.tenants[tenant] = t
	}
	next := *t
	if single {
		next.singles++
	} else {
		next.others++
	}
	if n := slots(&next, coalesce); n > l.max && n > slots(t, coalesce) {
		if t.singles == 0 && t.others == 0 {
			delete(l.tenants, tenant)
		}
		return nil, errTenantBusy(l.max)
	}
	*t = next
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if single {
				t.singles--
			} else {
				t.others--
			}
			if t.singles == 0 && t.others == 0 {
				delete(l.tenants, tenant)
			}
		})
	}, nil
}

func errTenantBusy(max int) error {
	e := overage.Errorf(overage.EBUSY, "tenant-busy",
		"this tenant already has %d requests in execution (TENANT_MAX_INFLIGHT); nothing was recorded, retry after Retry-After with the same Idempotency-Key", max)
	e.RetryAfter = TenantBusyRetryAfter
	return e
}
