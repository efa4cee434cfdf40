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
			unlock, err := l.lock(context.Background(), []string{"cus_a\x00m", "cus_b\x00m"}[k], 1, 0)
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
	unlock, err := l.lock(context.Background(), "k", 1, 0)
	if err != nil {
		t.Fatalf("lock: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.lock(ctx, "k", 1, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiting on a held key: got %v, want the context's error", err)
	}
	if n := l.size(); n != 1 {
		t.Errorf("%d entries while held after a waiter gave up, want 1", n)
	}
	unlock()
	if n := l.size(); n != 0 {
		t.Errorf("%d entries after release, want 0", n)
	}
	unlock2, err := l.lock(context.Background(), "k", 1, 0)
	if err != nil {
		t.Fatalf("relock: %v", err)
	}
	unlock2()
}

func TestKeyedLockBoundsTheLineBehindASlowHolder(t *testing.T) {
	t.Parallel()
	const slow = 50 * time.Millisecond
	l := newKeyedLock()
	unlock, err := l.lock(context.Background(), "k", 2, slow)
	if err != nil {
		t.Fatalf("lock: %v", err)
	}
	// While the holder is fast, callers queue without limit.
	results := make(chan error, 4)
	for range 4 {
		go func() {
			u, err := l.lock(context.Background(), "k", 2, slow)
			if err == nil {
				u()
			}
			results <- err
		}()
	}
	// Once it is slow, all but one of them give up with errBusy.
	for range 3 {
		if err := <-results; !errors.Is(err, errBusy) {
			t.Fatalf("waiter behind a slow holder: got %v, want errBusy", err)
		}
	}
	if _, err := l.lock(context.Background(), "k", 2, slow); !errors.Is(err, errBusy) {
		t.Fatalf("newcomer behind a slow holder and a full line: got %v, want errBusy at once", err)
	}
	if u, err := l.lock(context.Background(), "other", 2, slow); err != nil {
		t.Fatalf("another key is not limited by this one: %v", err)
	} else {
		u()
	}
	unlock()
	if err := <-results; err != nil {
		t.Fatalf("the waiter that stayed in line: %v", err)
	}
	if n := l.size(); n != 0 {
		t.Errorf("%d entries after release, want 0", n)
	}
}
