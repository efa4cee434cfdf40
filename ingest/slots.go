package ingest

import (
	"math/rand/v2"
	"slices"
	"sync"
)

// Slots. The rows every event of a tenant would otherwise update — its
// period's running total (allowance_usage) and its finance counters
// (billing_counters) — are spread over slot rows, summed on read. A row an
// ingest transaction updates stays locked until it commits, WAL flush
// included, so two concurrent transactions on one slot row commit one
// after the other. A slot drawn at random per transaction would still
// collide often (32 transactions in flight over 64 slots: about a third
// of them wait). Instead a process leases each transaction a slot no other
// transaction of the process holds, so they never wait for each other.
//
// The free slots are a stack: the most recently released slot is leased
// first, so a lightly loaded tenant keeps touching the same few rows and a
// finance read sums about as many rows per tenant as its peak concurrency,
// not all 64. Each process starts from its own random order, so the
// replicas' busiest slots rarely coincide; when they do, a transaction
// only waits for another's commit, as before slots.
//
// Slot 0 is not leased: it is the allowance's ordered row, and the
// counters' row for writers that take no lease (the report workers, an
// operator's UPDATE).
const numSlots = 64

type slotLeases struct {
	mu   sync.Mutex
	free []int16
}

func newSlotLeases() *slotLeases {
	l := &slotLeases{free: make([]int16, numSlots)}
	for i := range l.free {
		l.free[i] = int16(i + 1)
	}
	rand.Shuffle(len(l.free), func(i, j int) { l.free[i], l.free[j] = l.free[j], l.free[i] })
	return l
}

// take leases a slot; past numSlots transactions in flight, it shares one
// drawn at random.
func (l *slotLeases) take() int16 {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(l.free)
	if n == 0 {
		return int16(1 + rand.IntN(numSlots))
	}
	s := l.free[n-1]
	l.free = l.free[:n-1]
	return s
}

// give returns a slot taken with take.
func (l *slotLeases) give(s int16) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// A slot shared past numSlots leases comes back once per holder: keep
	// one copy.
	if len(l.free) < numSlots && !slices.Contains(l.free, s) {
		l.free = append(l.free, s)
	}
}
