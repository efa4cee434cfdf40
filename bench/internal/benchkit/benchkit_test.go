package benchkit

import (
	"testing"
	"time"

	"github.com/overage-billing/overage/stripeclient/emulator"
)

func TestCountCalls(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	reqs := []emulator.Request{
		{ReceivedAt: t0.Add(1500 * time.Millisecond), Outcome: emulator.OutcomeApplied},
		{ReceivedAt: t0.Add(100 * time.Millisecond), Outcome: emulator.OutcomeApplied},
		{ReceivedAt: t0.Add(1900 * time.Millisecond), Outcome: emulator.OutcomeRateLimited},
		{ReceivedAt: t0.Add(1100 * time.Millisecond), Outcome: emulator.OutcomeConcurrentRateLimit},
		{ReceivedAt: t0.Add(2100 * time.Millisecond), Outcome: emulator.OutcomeReplayed},
	}
	got := CountCalls(reqs)
	want := Calls{Total: 5, PeakPerSecond: 3, Refused429: 2, First: t0.Add(100 * time.Millisecond), Last: t0.Add(2100 * time.Millisecond)}
	if got != want {
		t.Fatalf("CountCalls = %+v, want %+v", got, want)
	}
}

func TestSumCPUCountsEachBackendOnceAtItsLatest(t *testing.T) {
	early := map[int]time.Duration{1: 2 * time.Second, 2: time.Second} // 2 exits before the end
	late := map[int]time.Duration{1: 5 * time.Second, 3: time.Second}
	if got := SumCPU(early, late); got != 7*time.Second {
		t.Fatalf("SumCPU = %v, want 7s", got)
	}
}

func TestSortedPercentiles(t *testing.T) {
	var samples []time.Duration
	for i := 100; i >= 1; i-- {
		samples = append(samples, time.Duration(i)*time.Millisecond)
	}
	if p50, p99 := SortedPercentiles(samples); p50 != 50 || p99 != 99 {
		t.Fatalf("p50, p99 = %v, %v ms; want 50, 99", p50, p99)
	}
	if p50, _ := SortedPercentiles(nil); p50 != 0 {
		t.Fatalf("p50 of nothing = %v", p50)
	}
}
