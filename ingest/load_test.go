package ingest_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/overage-billing/overage/ingest"
)

// eventLoad records single events under new keys from several clients
// until it is finished: the load a maintenance step must not disturb.
// Every request must record a new log within maxLatency.
type eventLoad struct {
	mu       sync.Mutex
	keys     []string
	failures []string
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startEventLoad(clients int, prefix string, maxLatency time.Duration, record func(key string) (*ingest.Outcome, error)) *eventLoad {
	l := &eventLoad{stop: make(chan struct{})}
	for c := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				key := fmt.Sprintf("%s-%d-%d", prefix, c, i)
				t0 := time.Now()
				out, err := record(key)
				took := time.Since(t0)
				l.mu.Lock()
				switch {
				case err != nil || out.Kind != ingest.OutcomeNew:
					l.failures = append(l.failures, fmt.Sprintf("%s: %v (%+v)", key, err, out))
				case took > maxLatency:
					l.failures = append(l.failures, fmt.Sprintf("%s took %v", key, took))
				default:
					l.keys = append(l.keys, key)
				}
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// recorded is how many events were recorded so far; a failure so far
// fails t at once.
func (l *eventLoad) recorded(t *testing.T) int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.failures) > 0 {
		t.Fatalf("%d requests failed, first: %s", len(l.failures), l.failures[0])
	}
	return len(l.keys)
}

// finish stops the clients and returns the keys recorded, failing t if
// any request failed.
func (l *eventLoad) finish(t *testing.T) []string {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	l.recorded(t)
	return l.keys
}
