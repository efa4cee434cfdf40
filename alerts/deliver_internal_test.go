package alerts

import (
	"testing"
	"time"
)

// The defaults are the contract's: a 10 s cut, retries for 3 days; the
// backoff doubles from the base up to the cap, with jitter.
func TestDeliveryDefaultsAndBackoff(t *testing.T) {
	d := NewDeliverer(nil, DeliverConfig{})
	if d.cfg.Timeout != 10*time.Second || d.client.Timeout != 10*time.Second || d.cfg.MaxAge != 72*time.Hour {
		t.Fatalf("defaults: timeout %s (client %s), max age %s", d.cfg.Timeout, d.client.Timeout, d.cfg.MaxAge)
	}
	d = NewDeliverer(nil, DeliverConfig{BaseBackoff: time.Second, MaxBackoff: time.Minute})
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 6: 32 * time.Second, 7: time.Minute, 40: time.Minute} {
		seen := map[time.Duration]bool{}
		for range 50 {
			b := d.backoff(attempt)
			if b < want/2 || b > want {
				t.Fatalf("backoff(%d) = %s, want within [%s, %s]", attempt, b, want/2, want)
			}
			seen[b] = true
		}
		if len(seen) < 10 {
			t.Errorf("backoff(%d) has no jitter: %v", attempt, seen)
		}
	}
}
