package stripeclient

import (
	"context"
	"sync"
)

// keyedLock is a set of mutexes, one per key, created on demand and removed
// when nobody holds or waits for them, so a long-running worker that sees
// millions of customers does not grow without bound. Waiting honours ctx.
type keyedLock struct {
	mu      sync.Mutex
	entries map[string]*lockEntry
}

type lockEntry struct {
	sem  chan struct{} // capacity 1: a token in the channel means "held"
	refs int           // holders + waiters; guarded by keyedLock.mu
}

func newKeyedLock() *keyedLock {
	return &keyedLock{entries: make(map[string]*lockEntry)}
}

// lock blocks until key is held by the caller or ctx ends. On success the
// returned func releases it and must be called exactly once.
func (l *keyedLock) lock(ctx context.Context, key string) (func(), error) {
	l.mu.Lock()
	e, ok := l.entries[key]
	if !ok {
		e = &lockEntry{sem: make(chan struct{}, 1)}
		l.entries[key] = e
	}
	e.refs++
	l.mu.Unlock()

	select {
	case e.sem <- struct{}{}:
		return func() {
			<-e.sem
			l.drop(key, e)
		}, nil
	case <-ctx.Done():
		l.drop(key, e)
		return nil, ctx.Err()
	}
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
