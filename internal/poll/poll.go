// Package poll waits in tests for a state reached in another goroutine or
// process with nothing to signal it, by checking a condition until it holds.
package poll

import (
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
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(interval)
	}
}
