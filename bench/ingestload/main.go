// Command ingestload drives POST /v1/usage-events (or, with -batch N,
// POST /v1/usage-events/batch with N events a request) over real HTTP with
// a fixed number of concurrent clients for a fixed duration, every request
// new under a new Idempotency-Key, and prints events/s and requests/s with
// p50 and p99 request latency as one JSON line. With -window it also
// prints each window's figures to stderr as the window ends, and all of
// them in the JSON line ("windows"): a soak shows whether throughput holds.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/overage-billing/overage/bench/internal/benchkit"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:18080", "base URL of overage serve")
	clients := flag.Int("clients", 8, "concurrent clients")
	duration := flag.Duration("duration", 10*time.Second, "how long to send")
	tenants := flag.Int("tenants", 100, "benchmark tenants (API keys benchkit.BenchKey(1..N))")
	batch := flag.Int("batch", 0, "events per request on the batch endpoint; 0 sends single events")
	model := flag.String("model", benchkit.DefaultEvent.Model, "model_id of every event")
	cacheRead := flag.Int("cache-read", 0, "cache_read_input_tokens of every event (of its 1,200 input tokens); 0 sends none")
	requestIDs := flag.Bool("request-ids", false, "give every single event a new request_id (batches always carry them): without one ingest skips the lookup of earlier logs by request_id")
	window := flag.Duration("window", 0, "also print events/s and p99 of each window this long (a soak); 0: only the totals")
	flag.Parse()
	windows := newWindows(*window, max(1, *batch))
	ev := benchkit.Event{Model: *model, CacheRead: *cacheRead}

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
				body, path := ev.Single(i), "/v1/usage-events"
				if *requestIDs {
					body = ev.SingleWithRequestID(i, fmt.Sprintf("s-%d-%d-%d", start.UnixNano(), c, i))
				}
				if *batch > 0 {
					path = "/v1/usage-events/batch"
					body = ev.Batch(fmt.Sprintf("r-%d-%d-%d-", start.UnixNano(), c, i), *batch)
				}
				t0 := time.Now()
				status, err := benchkit.Post(hc, *url+path, benchkit.BenchKey(tenant), fmt.Sprintf("load-%d-%d-%d", start.UnixNano(), c, i), body)
				if err != nil {
					localErr++
					continue
				}
				localStatus[status]++
				if status != http.StatusAccepted {
					localErr++
					continue
				}
				d := time.Since(t0)
				local = append(local, d)
				windows.add(t0.Sub(start)+d, d)
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
	p50, p99 := benchkit.SortedPercentiles(lat)
	perReq := max(1, *batch)
	out := map[string]any{
		"clients": *clients, "requests": len(lat), "events": len(lat) * perReq, "errors": errs, "statuses": statuses,
		"events_per_s":   float64(len(lat)*perReq) / elapsed.Seconds(),
		"requests_per_s": float64(len(lat)) / elapsed.Seconds(),
		"p50_ms":         p50, "p99_ms": p99,
	}
	if *window > 0 {
		out["windows"] = windows.summary()
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
	if errs > 0 {
		os.Exit(1)
	}
}

// windows collects the answered requests of each -window period, by the
// time each answer arrived.
type windows struct {
	mu    sync.Mutex
	width time.Duration
	per   int
	lat   map[int][]time.Duration
	shown int
}

func newWindows(width time.Duration, eventsPerRequest int) *windows {
	return &windows{width: width, per: eventsPerRequest, lat: map[int][]time.Duration{}}
}

func (w *windows) add(at, latency time.Duration) {
	if w.width <= 0 {
		return
	}
	i := int(at / w.width)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lat[i] = append(w.lat[i], latency)
	// The first answer of a later window shows the windows before it.
	for ; w.shown < i; w.shown++ {
		fmt.Fprintln(os.Stderr, w.line(w.shown))
	}
}

func (w *windows) line(i int) string {
	b, _ := json.Marshal(w.stat(i))
	return string(b)
}

func (w *windows) stat(i int) map[string]any {
	p50, p99 := benchkit.SortedPercentiles(w.lat[i])
	return map[string]any{
		"window_end_s": (time.Duration(i+1) * w.width).Seconds(),
		"events_per_s": float64(len(w.lat[i])*w.per) / w.width.Seconds(),
		"p50_ms":       p50, "p99_ms": p99,
	}
}

// summary is every complete window: the last, cut short by the end of the
// run, is left out.
func (w *windows) summary() []map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []map[string]any
	for i := 0; i < w.shown; i++ {
		out = append(out, w.stat(i))
	}
	return out
}
