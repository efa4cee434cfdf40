// Package poll waits for a state reached in another goroutine or process
// with nothing to signal it, by checking a condition until it holds: Until
// in tests, Wait where a condition may fail (the demo of `overage dev`).
package poll

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// interval is short against the tests' waits and long enough that a
// condition reading the database does not load it.
const interval = 10 * time.Millisecond

// Until checks cond every few milliseconds and fails the test, naming what
// it waited for, if cond does not hold within timeout.
func Until(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	err := Wait(context.Background(), what, timeout, interval, func() (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatal(err)
	}
}

// Wait checks cond every, until it holds (nil), fails (its error), ctx is
// done or timeout passes (an error naming what it waited for).
func Wait(ctx context.Context, what string, timeout, every time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}
