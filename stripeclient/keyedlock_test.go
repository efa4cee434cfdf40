package stripeclient

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestKeyedLockExcludesPerKeyAndCleansUp(t *testing.T) {
	t.Parallel()
	l := newKeyedLock()
	var inside [2]atomic.Int32
	var overlap atomic.Bool
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := i % 2
			unlock, err := l.lock(context.Background(), []string{"cus_a\x00m", "cus_b\x00m"}[k])
			if err != nil {
				t.Errorf("lock: %v", err)
				return
			}
			if inside[k].Add(1) > 1 {
				overlap.Store(true)
			}
			time.Sleep(100 * time.Microsecond) // widen the window an overlap would need
			inside[k].Add(-1)
			unlock()
		}()
	}
	wg.Wait()
	if overlap.Load() {
		t.Errorf("two holders of one key at once")
	}
	if n := l.size(); n != 0 {
		t.Errorf("%d entries left after every holder released, want 0", n)
	}
}

func TestKeyedLockWaitHonoursContext(t *testing.T) {
	t.Parallel()
	l := newKeyedLock()
	unlock, err := l.lock(context.Background(), "k")
	if err != nil {
		t.Fatalf("lock: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.lock(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiting on a held key: got %v, want the context's error", err)
	}
	if n := l.size(); n != 1 {
		t.Errorf("%d entries while held after a waiter gave up, want 1", n)
	}
	unlock()
	if n := l.size(); n != 0 {
		t.Errorf("%d entries after release, want 0", n)
	}
	unlock2, err := l.lock(context.Background(), "k")
	if err != nil {
		t.Fatalf("relock: %v", err)
	}
	unlock2()
}
