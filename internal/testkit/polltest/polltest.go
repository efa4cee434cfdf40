// Package polltest waits in a test for a state reached in another
// goroutine or process with nothing to signal it (internal/poll.Wait,
// failing the test when it times out).
package polltest

import (
	"context"
	"testing"
	"time"

	"github.com/overage-billing/overage/internal/poll"
)

// interval is short against the tests' waits and long enough that a
// condition reading the database does not load it.
const interval = 10 * time.Millisecond

// Until checks cond every few milliseconds and fails the test, naming what
// it waited for, if cond does not hold within timeout.
func Until(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	err := poll.Wait(context.Background(), what, timeout, interval, func() (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatal(err)
	}
}
