package metrics

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestBacklogIsReadOncePerTTL: scrapes within BacklogCacheTTL of a read,
// concurrent ones included, share it (the oldest log's age still grows);
// the next scrape after it reads again; a failed read is not retried
// before the TTL either.
func TestBacklogIsReadOncePerTTL(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	clock := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	var reads atomic.Int64
	var fail atomic.Bool
	oldest := clock.Add(-time.Minute)
	c := newBacklogCollector(func(context.Context) (Backlog, error) {
		reads.Add(1)
		if fail.Load() {
			return Backlog{}, errors.New("database down")
		}
		return Backlog{Pending: reads.Load(), OldestPending: &oldest, Now: now()}, nil
	}, nil, now)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	gauge := func(name string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = reg.Gather() }()
	}
	wg.Wait()
	if n := reads.Load(); n != 1 {
		t.Fatalf("16 concurrent scrapes read the backlog %d times, want 1", n)
	}
	advance(BacklogCacheTTL - time.Second)
	if p, age := gauge("overage_pending_usage_logs"), gauge("overage_oldest_pending_age_seconds"); p != 1 || age != 60+BacklogCacheTTL.Seconds()-1 {
		t.Errorf("within the TTL: pending %v, age %v; want the cached 1 and an age grown by the time since", p, age)
	}
	advance(time.Second)
	if p := gauge("overage_pending_usage_logs"); p != 2 || reads.Load() != 2 {
		t.Errorf("after the TTL: pending %v after %d reads, want a new read", p, reads.Load())
	}
	fail.Store(true)
	advance(BacklogCacheTTL)
	for range 3 {
		if up := gauge("overage_backlog_scrape_ok"); up != 0 {
			t.Errorf("overage_backlog_scrape_ok = %v with the database down", up)
		}
	}
	if n := reads.Load(); n != 3 {
		t.Errorf("3 scrapes with the database down read %d times in all, want 3 (one more)", n)
	}
	if p := gauge("overage_pending_usage_logs"); p != -1 {
		t.Errorf("a failed read still exports the backlog: pending %v", p)
	}
}
