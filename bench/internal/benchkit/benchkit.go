// Package benchkit holds what the benchmark programs in bench/ share: the
// usage-event request bodies and their POST, the `overage work` child
// process pointed at the Stripe emulator, and the figures drawn from the
// emulator's request log and from latency samples.
package benchkit

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/stripeclient/emulator"
)

// Event shapes the benchmark's usage events: every event is of Model, with
// 1,200 input tokens (CacheRead of them read from the cache, sent as
// cache_read_input_tokens when > 0) and 350 output tokens.
type Event struct {
	Model     string
	CacheRead int
}

// DefaultEvent is the benchmarks' usual event: gpt-4o, no cache read.
var DefaultEvent = Event{Model: "gpt-4o"}

// MeterModel is the model the per-model meters of the meter benchmarks
// match (bench/meters.sh creates them: m_input, m_cache, m_output).
const MeterModel = "gpt-4o"

func (e Event) fields(b *strings.Builder) {
	model := e.Model
	if model == "" {
		model = DefaultEvent.Model
	}
	fmt.Fprintf(b, `"model_id":"%s","input_tokens":1200,"output_tokens":350`, model)
	if e.CacheRead > 0 {
		fmt.Fprintf(b, `,"cache_read_input_tokens":%d`, e.CacheRead)
	}
}

// Single is one usage event for POST /v1/usage-events.
func (e Event) Single(i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"user_id":"u_%d",`, i)
	e.fields(&b)
	b.WriteByte('}')
	return b.String()
}

// SingleWithRequestID is Single under the request_id rid: a lookup of
// earlier logs by request_id runs for it (an event without one skips it).
func (e Event) SingleWithRequestID(i int, rid string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"request_id":"%s","user_id":"u_%d",`, rid, i)
	e.fields(&b)
	b.WriteByte('}')
	return b.String()
}

// Batch is n usage events for POST /v1/usage-events/batch, their
// request_ids requestIDPrefix followed by the event's index, so a caller
// can find a batch's usage logs again.
func (e Event) Batch(requestIDPrefix string, n int) string {
	var b strings.Builder
	b.Grow(n * 150)
	b.WriteString(`{"events":[`)
	for j := range n {
		if j > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"request_id":"%s%d","user_id":"u_%d",`, requestIDPrefix, j, j)
		e.fields(&b)
		b.WriteByte('}')
	}
	b.WriteString(`]}`)
	return b.String()
}

// SingleBody is DefaultEvent.Single.
func SingleBody(i int) string { return DefaultEvent.Single(i) }

// BatchBody is DefaultEvent.Batch.
func BatchBody(requestIDPrefix string, n int) string { return DefaultEvent.Batch(requestIDPrefix, n) }

// BenchKey is the API key of benchmark tenant n (1-based), as
// bench/setup.sql stores it: well formed (ovg_ and 43 base64url
// characters), since serve refuses any other without a query.
func BenchKey(n int) string { return fmt.Sprintf("ovg_bench%038d", n) }

// Post sends one usage-event request and returns its status, the body
// read and discarded so the connection is reused.
func Post(hc *http.Client, url, apiKey, idempotencyKey, body string) (int, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Idempotency-Key", idempotencyKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, nil
}

// Percentile of sorted samples, in milliseconds; 0 without samples.
func Percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[int(float64(len(sorted)-1)*p)].Microseconds()) / 1000
}

// SortedPercentiles sorts the samples and returns p50 and p99 in ms.
func SortedPercentiles(samples []time.Duration) (p50, p99 float64) {
	slices.Sort(samples)
	return Percentile(samples, 0.50), Percentile(samples, 0.99)
}

// Calls summarises the emulator's meter-event calls: how many, the busiest
// wall-clock second, and how many Stripe refused for its rate limits (the
// account's calls per second, or one call at a time per customer and meter).
// First and Last are when the first and the last call arrived.
type Calls struct {
	Total, PeakPerSecond, Refused429 int
	First, Last                      time.Time
}

// CountCalls reads the emulator's request log.
func CountCalls(reqs []emulator.Request) Calls {
	perSecond := map[int64]int{}
	c := Calls{Total: len(reqs)}
	for i, r := range reqs {
		if i == 0 || r.ReceivedAt.Before(c.First) {
			c.First = r.ReceivedAt
		}
		if r.ReceivedAt.After(c.Last) {
			c.Last = r.ReceivedAt
		}
		perSecond[r.ReceivedAt.Unix()]++
		if r.Outcome == emulator.OutcomeRateLimited || r.Outcome == emulator.OutcomeConcurrentRateLimit {
			c.Refused429++
		}
	}
	for _, n := range perSecond {
		c.PeakPerSecond = max(c.PeakPerSecond, n)
	}
	return c
}

// WorkOpts configure the `overage work` child process.
type WorkOpts struct {
	Bin         string // the overage binary
	DatabaseURL string
	StripeBase  string // the emulator's base URL
	RateLimit   int    // STRIPE_RATE_LIMIT
	Workers     int    // REPORT_WORKERS
	BatchMax    int    // REPORT_BATCH_MAX; 0 leaves the default
}

// Child is an `overage` process the benchmark started.
type Child struct{ cmd *exec.Cmd }

// StartWork runs `overage work` against the emulator.
func StartWork(o WorkOpts) (*Child, error) {
	env := []string{"DATABASE_URL=" + o.DatabaseURL, "STRIPE_SECRET_KEY=sk_test_123", "STRIPE_API_BASE=" + o.StripeBase,
		"STRIPE_RATE_LIMIT=" + strconv.Itoa(o.RateLimit), "REPORT_WORKERS=" + strconv.Itoa(o.Workers)}
	if o.BatchMax > 0 {
		env = append(env, "REPORT_BATCH_MAX="+strconv.Itoa(o.BatchMax))
	}
	return start(o.Bin, "work", env...)
}

// StartServe runs `overage serve` on addr and waits until it is ready.
func StartServe(bin, dbURL, addr string) (*Child, error) {
	c, err := start(bin, "serve", "DATABASE_URL="+dbURL, "LISTEN_ADDR="+addr)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return c, nil
			}
		}
		if time.Now().After(deadline) {
			c.Stop()
			return nil, fmt.Errorf("%s serve on %s not ready after 30 s (last: %v)", bin, addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func start(bin, subcommand string, env ...string) (*Child, error) {
	cmd := exec.Command(bin, subcommand)
	cmd.Env = append(append(os.Environ(), "LOG_LEVEL=warn"), env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s %s: %w", bin, subcommand, err)
	}
	return &Child{cmd: cmd}, nil
}

// Stop ends the process with SIGTERM and waits for it, so none outlives
// the benchmark, and returns the CPU time it used (user and system).
func (c *Child) Stop() time.Duration {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	_ = c.cmd.Wait()
	return c.cmd.ProcessState.UserTime() + c.cmd.ProcessState.SystemTime()
}

// MachineCPU reads /proc/stat: the busy and total jiffies of all cores
// since boot, for the machine's busy share over an interval. Zeros where
// there is no /proc.
func MachineCPU() (busy, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		n, _ := strconv.ParseUint(f, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

// BackendCPU is the CPU time (user and system) each PostgreSQL backend
// serving the pool's database has used so far, by process id: PostgreSQL's
// share of a benchmark when it runs on the same machine (read from /proc,
// so only there; empty elsewhere).
func BackendCPU(ctx context.Context, pool *pgxpool.Pool) (map[int]time.Duration, error) {
	return BackendCPUOf(ctx, pool, "")
}

// BackendCPUOf is BackendCPU of the backends whose application_name is
// appName ("": every backend).
func BackendCPUOf(ctx context.Context, pool *pgxpool.Pool, appName string) (map[int]time.Duration, error) {
	rows, err := pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND ($1 = '' OR application_name = $1)", appName)
	if err != nil {
		return nil, fmt.Errorf("list backends: %w", err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("list backends: %w", err)
	}
	cpu := map[int]time.Duration{}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // gone, or no /proc
		}
		// Fields after the command name in parentheses: utime and stime
		// are the 12th and 13th, in clock ticks (100 a second on Linux).
		_, rest, _ := strings.Cut(string(b), ") ")
		f := strings.Fields(rest)
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		cpu[int(pid)] = time.Duration(u+s) * 10 * time.Millisecond
	}
	return cpu, nil
}

// SumCPU adds up backend CPU snapshots taken at different times, each
// backend counted once at its latest.
func SumCPU(snapshots ...map[int]time.Duration) time.Duration {
	latest := map[int]time.Duration{}
	for _, s := range snapshots {
		for pid, d := range s {
			latest[pid] = max(latest[pid], d)
		}
	}
	var sum time.Duration
	for _, d := range latest {
		sum += d
	}
	return sum
}

// Offer is an open-loop offer of batches: each of Tenants sends a batch of
// Batch events of Event every interval (Tenants × Batch / Rate seconds),
// the tenants staggered evenly across it, from Start for Duration. A
// tenant whose answer comes late sends its next batch at once, so the
// offer is kept as long as the server can.
type Offer struct {
	Addr     string
	Tenants  int
	Batch    int
	Rate     float64 // events a second offered
	Duration time.Duration
	Event    Event
	// KeyPrefix starts each batch's Idempotency-Key, followed by its
	// sequence number (1, 2, …), which also prefixes its request_ids.
	KeyPrefix string
}

// Run sends the offer from start and returns once every batch is
// answered. answered is called, from many goroutines, with each batch's
// sequence number, the status (or the error) and when the answer came.
func (o Offer) Run(start time.Time, answered func(seq int64, status int, err error, at time.Time)) {
	interval := time.Duration(float64(time.Second) * float64(o.Tenants*o.Batch) / o.Rate)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Tenants}, Timeout: time.Minute}
	var (
		seq atomic.Int64
		wg  sync.WaitGroup
	)
	for tn := 1; tn <= o.Tenants; tn++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				at := start.Add(interval*time.Duration(tn-1)/time.Duration(o.Tenants) + interval*time.Duration(k))
				if at.Sub(start) >= o.Duration {
					return
				}
				time.Sleep(time.Until(at))
				n := seq.Add(1)
				id := strconv.FormatInt(n, 10)
				status, err := Post(hc, "http://"+o.Addr+"/v1/usage-events/batch", BenchKey(tn),
					o.KeyPrefix+id, o.Event.Batch(id+".", o.Batch))
				answered(n, status, err, time.Now())
			}
		}()
	}
	wg.Wait()
}
