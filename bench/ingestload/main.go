// Command ingestload drives POST /v1/usage-events (or, with -batch N,
// POST /v1/usage-events/batch with N events a request) over real HTTP with
// a fixed number of concurrent clients for a fixed duration, every request
// new under a new Idempotency-Key, and prints events/s and requests/s with
// p50 and p99 request latency as one JSON line.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:18080", "base URL of overage serve")
	clients := flag.Int("clients", 8, "concurrent clients")
	duration := flag.Duration("duration", 10*time.Second, "how long to send")
	tenants := flag.Int("tenants", 100, "benchmark tenants (API keys ovg_bench1..N)")
	batch := flag.Int("batch", 0, "events per request on the batch endpoint; 0 sends single events")
	flag.Parse()

	tr := &http.Transport{MaxIdleConnsPerHost: *clients, MaxConnsPerHost: *clients}
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()

	var mu sync.Mutex
	var lat []time.Duration
	errs := 0
	statuses := map[int]int{}
	var wg sync.WaitGroup
	start := time.Now()
	for c := range *clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local []time.Duration
			localErr := 0
			localStatus := map[int]int{}
			for i := 0; ctx.Err() == nil; i++ {
				tenant := (c*7919+i)%*tenants + 1
				body, path := fmt.Sprintf(`{"user_id":"u_%d","model_id":"gpt-4o","input_tokens":1200,"output_tokens":350}`, i), "/v1/usage-events"
				if *batch > 0 {
					path = "/v1/usage-events/batch"
					var b strings.Builder
					b.WriteString(`{"events":[`)
					for j := range *batch {
						if j > 0 {
							b.WriteByte(',')
						}
						fmt.Fprintf(&b, `{"request_id":"r-%d-%d-%d-%d","user_id":"u_%d","model_id":"gpt-4o","input_tokens":1200,"output_tokens":350}`, start.UnixNano(), c, i, j, j)
					}
					b.WriteString(`]}`)
					body = b.String()
				}
				req, _ := http.NewRequest(http.MethodPost, *url+path, bytes.NewBufferString(body))
				req.Header.Set("Authorization", fmt.Sprintf("Bearer ovg_bench%d", tenant))
				req.Header.Set("Idempotency-Key", fmt.Sprintf("load-%d-%d-%d", start.UnixNano(), c, i))
				req.Header.Set("Content-Type", "application/json")
				t0 := time.Now()
				res, err := hc.Do(req)
				if err != nil {
					localErr++
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				localStatus[res.StatusCode]++
				if res.StatusCode != http.StatusAccepted {
					localErr++
					continue
				}
				local = append(local, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, local...)
			errs += localErr
			for k, v := range localStatus {
				statuses[k] += v
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[int(float64(len(lat)-1)*p)].Microseconds()) / 1000
	}
	perReq := max(1, *batch)
	out := map[string]any{
		"clients": *clients, "requests": len(lat), "events": len(lat) * perReq, "errors": errs, "statuses": statuses,
		"events_per_s":   float64(len(lat)*perReq) / elapsed.Seconds(),
		"requests_per_s": float64(len(lat)) / elapsed.Seconds(),
		"p50_ms":         pct(0.50), "p99_ms": pct(0.99),
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
	if errs > 0 {
		os.Exit(1)
	}
}
