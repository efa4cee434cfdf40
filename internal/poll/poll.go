// Package poll waits for a state reached in another goroutine or process
// with nothing to signal it, by checking a condition until it holds (the
// demo of `overage dev`; tests use internal/testkit/polltest.Until).
package poll

import (
	"context"
	"fmt"
	"time"
)

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
