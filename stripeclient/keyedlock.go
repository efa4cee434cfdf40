package stripeclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// errBusy is what a busyError is: the key's holder is slow and enough
// callers already wait behind it.
var errBusy = errors.New("too many calls queued behind a slow one")

// busyError refuses a caller of a key whose holder has held it for heldFor.
type busyError struct{ heldFor time.Duration }

func (e *busyError) Error() string {
	return fmt.Sprintf("%v (in flight for %s)", errBusy, e.heldFor.Round(time.Millisecond))
}

func (e *busyError) Is(target error) bool { return target == errBusy }

// keyedLock is a set of mutexes, one per key, created on demand and removed
// when nobody holds or waits for them, so a long-running worker that sees
// millions of customers does not grow without bound. Waiting honours ctx.
//
// A key whose holder has held it for longer than slow is slow: then at most
// limit callers (the holder included) stay with it, and the others are
// refused, or give up waiting, with a busyError. Queueing behind a fast key
// is the quickest way through it; queueing behind a hanging one would hold
// every caller the process has.
type keyedLock struct {
	mu      sync.Mutex
	entries map[string]*lockEntry
}

type lockEntry struct {
	sem       chan struct{} // capacity 1: a token in the channel means "held"
	refs      int           // holders + waiters; guarded by keyedLock.mu
	heldSince time.Time     // zero while free; guarded by keyedLock.mu
}

func newKeyedLock() *keyedLock {
	return &keyedLock{entries: make(map[string]*lockEntry)}
}

// lock blocks until key is held by the caller or ctx ends, or refuses with a
// busyError as the type describes (never when slow is 0). On success the
// returned func releases the key and must be called exactly once.
func (l *keyedLock) lock(ctx context.Context, key string, limit int, slow time.Duration) (func(), error) {
	l.mu.Lock()
	e, ok := l.entries[key]
	if !ok {
		e = &lockEntry{sem: make(chan struct{}, 1)}
		l.entries[key] = e
	}
	if held := e.slowFor(slow); held > 0 && e.refs >= limit {
		l.mu.Unlock()
		return nil, &busyError{heldFor: held}
	}
	e.refs++
	l.mu.Unlock()

	acquired := func() func() {
		l.mu.Lock()
		e.heldSince = time.Now()
		l.mu.Unlock()
		return func() {
			l.mu.Lock()
			e.heldSince = time.Time{}
			l.mu.Unlock()
			<-e.sem
			l.drop(key, e)
		}
	}
	// A free key is taken without a timer: that is every call of a
	// customer without a backlog.
	select {
	case e.sem <- struct{}{}:
		return acquired(), nil
	default:
	}
	var recheck <-chan time.Time
	if slow > 0 {
		t := time.NewTicker(max(slow/4, 10*time.Millisecond))
		defer t.Stop()
		recheck = t.C
	}
	for {
		select {
		case e.sem <- struct{}{}:
			return acquired(), nil
		case <-ctx.Done():
			l.drop(key, e)
			return nil, ctx.Err()
		case <-recheck:
			// The holder became slow while we waited: leave if we are one
			// too many. Deciding under the mutex lets exactly the excess go.
			l.mu.Lock()
			if held := e.slowFor(slow); held > 0 && e.refs > limit {
				e.refs--
				l.mu.Unlock()
				return nil, &busyError{heldFor: held}
			}
			l.mu.Unlock()
		}
	}
}

// slowFor is how long the key has been held when that is at least slow,
// else 0. Called with keyedLock.mu held.
func (e *lockEntry) slowFor(slow time.Duration) time.Duration {
	if slow <= 0 || e.heldSince.IsZero() {
		return 0
	}
	if held := time.Since(e.heldSince); held >= slow {
		return held
	}
	return 0
}

func (l *keyedLock) drop(key string, e *lockEntry) {
	l.mu.Lock()
	e.refs--
	if e.refs == 0 {
		delete(l.entries, key)
	}
	l.mu.Unlock()
}

// size is the number of live entries; for tests of the clean-up.
func (l *keyedLock) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries)
}
