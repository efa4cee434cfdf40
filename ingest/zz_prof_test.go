package ingest_test

import (
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestZZProfileBatchHTTP(t *testing.T) {
	if os.Getenv("ZZPROF") == "" {
		t.Skip()
	}
	b := setup(t)
	f, _ := os.Create("/tmp/zz_cpu.prof")
	pprof.StartCPUProfile(f)
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	n := 0
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Since(start) < 8*time.Second; i++ {
				evs := make([]string, 1000)
				for j := range evs {
					evs[j] = batchEvent(fmt.Sprintf("r-%d-%d-%d", c, i, j), 1200, 350)
				}
				r := b.postBatch(t, b.alice.APIKey, fmt.Sprintf("k-%d-%d", c, i), `{"events":[`+strings.Join(evs, ",")+`]}`)
				if r.status != 202 {
					t.Error(r.status)
				}
				mu.Lock()
				n++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	pprof.StopCPUProfile()
	t.Logf("%.0f events/s", 1000*float64(n)/time.Since(start).Seconds())
}
