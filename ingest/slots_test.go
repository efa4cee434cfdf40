package ingest

import (
	"sync"
	"testing"
)

// Transactions of one process in flight at once never share a slot, up to
// numSlots of them, and a released slot is the next one leased (so a
// lightly loaded tenant keeps writing the same rows).
func TestSlotLeasesAreExclusiveAndReused(t *testing.T) {
	t.Parallel()
	l := newSlotLeases()
	held := map[int16]bool{}
	for range numSlots {
		s := l.take()
		if s < 1 || s > numSlots || held[s] {
			t.Fatalf("leased slot %d twice or out of 1..%d (held %v)", s, numSlots, held)
		}
		held[s] = true
	}
	if s := l.take(); s < 1 || s > numSlots {
		t.Fatalf("past %d leases: slot %d, want a shared one in 1..%d", numSlots, s, numSlots)
	}
	l.give(7)
	if s := l.take(); s != 7 {
		t.Fatalf("took %d, want 7, the slot just released", s)
	}

	// Concurrently: no two holders at once.
	l = newSlotLeases()
	var mu sync.Mutex
	holders := map[int16]int{}
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				s := l.take()
				mu.Lock()
				holders[s]++
				if holders[s] > 1 {
					mu.Unlock()
					t.Errorf("slot %d held by two transactions", s)
					return
				}
				mu.Unlock()
				mu.Lock()
				holders[s]--
				mu.Unlock()
				l.give(s)
			}
		}()
	}
	wg.Wait()
}
