package ingest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Group commit. A single event in a transaction of its own costs
// PostgreSQL many times the CPU of an event of a batch: most of an
// ingest transaction's cost is per transaction (BEGIN, the reads, the
// report job, each write statement, COMMIT), not per event. So the single
// events of one tenant that arrive while its transactions are in flight
// are coalesced into one transaction that records all of them, each under
// its own Idempotency-Key with its own stored answer, exactly as separate
// transactions would (see executeOnce).
//
// It adds no latency when a tenant is idle: an event that finds fewer than
// defaultGroupsInFlight (INGEST_COALESCE) of its tenant's transactions
// running starts one at once with everything pending; otherwise it waits
// in the tenant's pending list and the next transaction to start takes the
// list (up to maxGroupEvents).
// Checkpoints, corrections and batches are not coalesced.
//
// A request whose key is already pending or in a running group of its
// tenant answers 409 in progress at once, as it would on meeting the key's
// lock: two requests under one key never share a group, nor wait on each
// other.
//
// The group's transaction is no member's: a client that hangs up does not
// cancel the others'. It ends by the earliest deadline among its members
// (they arrive one after another under the same request timeout, so
// that is about the first one's) and within lockTimeout. A member whose
// context ends while still pending leaves the list: nothing of it was
// recorded.

// defaultGroupsInFlight is how many transactions of one tenant run at once
// before its events wait to be coalesced. One: on a CPU-bound machine the
// fewer, larger transactions pay (docs/benchmarks.md, "Group commit of
// single events", has the settings measured).
const defaultGroupsInFlight = 1

// maxGroupEvents caps a group: the events waiting beyond it go in the next.
const maxGroupEvents = 128

type coalescer struct {
	svc       *Service
	inFlight  int
	maxEvents int

	mu      sync.Mutex
	tenants map[uuid.UUID]*tenantQueue
}

// tenantQueue is one tenant's transactions in flight and events waiting.
// It exists while running > 0; pending is never left non-empty with
// nothing running, since each group that ends takes what is pending.
type tenantQueue struct {
	running int
	pending []*waiter
	keys    map[string]bool // of the events pending or in a running group
}

// waiter is one event waiting for its group's answer.
type waiter struct {
	m        *groupMember
	deadline time.Time // its request's, if any
	taken    bool      // in a group: its answer will come
	done     chan struct{}
	out      *Outcome
	err      error
}

func newCoalescer(s *Service, inFlight, maxEvents int) *coalescer {
	return &coalescer{svc: s, inFlight: inFlight, maxEvents: maxEvents, tenants: map[uuid.UUID]*tenantQueue{}}
}

// record executes m in the next group of its tenant and returns its answer.
func (c *coalescer) record(ctx context.Context, tenantID uuid.UUID, m *groupMember) (*Outcome, error) {
	w := &waiter{m: m, done: make(chan struct{})}
	w.deadline, _ = ctx.Deadline()
	c.mu.Lock()
	q := c.tenants[tenantID]
	if q == nil {
		q = &tenantQueue{keys: map[string]bool{}}
		c.tenants[tenantID] = q
	}
	if q.keys[m.key] {
		c.mu.Unlock()
		return nil, errInProgress()
	}
	q.keys[m.key] = true
	q.pending = append(q.pending, w)
	var g []*waiter
	if q.running < c.inFlight {
		q.running++
		g = c.take(q)
	}
	c.mu.Unlock()
	if g != nil {
		c.run(tenantID, g)
	}
	select {
	case <-w.done:
		return w.out, w.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	if !w.taken {
		q.pending = slices.DeleteFunc(q.pending, func(x *waiter) bool { return x == w })
		delete(q.keys, m.key)
		c.mu.Unlock()
		// A deadline passed: 503, retry under the same key.
		return nil, dbError(fmt.Errorf("wait for the tenant's ingest transaction: %w", ctx.Err()))
	}
	c.mu.Unlock()
	// Its group is running: the answer comes within lockTimeout.
	<-w.done
	return w.out, w.err
}

// take removes the next group from q's pending list, in arrival order: at
// most maxEvents events (their keys are distinct: see record).
func (c *coalescer) take(q *tenantQueue) []*waiter {
	n, events := 0, 0
	for _, w := range q.pending {
		if events+len(w.m.events) > c.maxEvents && n > 0 {
			break
		}
		w.taken = true
		events += len(w.m.events)
		n++
	}
	g := q.pending[:n:n]
	q.pending = slices.Clone(q.pending[n:])
	return g
}

// run executes group g in one transaction, answers its members, and then
// starts the tenant's next group if events are waiting, or counts one
// transaction fewer in flight.
func (c *coalescer) run(tenantID uuid.UUID, g []*waiter) {
	members := make([]*groupMember, len(g))
	var deadline time.Time
	for i, w := range g {
		members[i] = w.m
		if !w.deadline.IsZero() && (deadline.IsZero() || w.deadline.Before(deadline)) {
			deadline = w.deadline
		}
	}
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	if c.svc.onGroup != nil {
		c.svc.onGroup(len(members))
	}
	answers, err := c.execute(ctx, tenantID, members)
	// The keys are free again before any member is answered: a client that
	// resends its key the moment it has its answer finds the stored record
	// (a replay), not its own group still counted as in progress.
	c.mu.Lock()
	q := c.tenants[tenantID]
	for _, w := range g {
		delete(q.keys, w.m.key)
	}
	var next []*waiter
	if len(q.pending) > 0 {
		next = c.take(q)
	} else if q.running--; q.running == 0 {
		delete(c.tenants, tenantID)
	}
	c.mu.Unlock()
	for i, w := range g {
		if err != nil {
			w.err = err
		} else {
			w.out, w.err = answers[i].out, answers[i].err
		}
		close(w.done)
	}
	if next != nil {
		// Not on this goroutine: it serves its own request, answered above.
		go c.run(tenantID, next)
	}
}

// execute runs the group's transaction. A panic in it becomes every
// member's error: left to unwind, it would leave the members waiting and
// the tenant's queue counting a transaction that never ends (or, on a
// goroutine of run's own, stop the process).
func (c *coalescer) execute(ctx context.Context, tenantID uuid.UUID, members []*groupMember) (answers []answer, err error) {
	defer func() {
		if r := recover(); r != nil {
			answers, err = nil, fmt.Errorf("ingest group of %d events: panic: %v", len(members), r)
		}
	}()
	return c.svc.executeGroup(ctx, newGroup(tenantID, members))
}
