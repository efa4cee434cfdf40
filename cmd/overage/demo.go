//go:build dev

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/alerts"
	"github.com/overage-billing/overage/client"
	"github.com/overage-billing/overage/internal/poll"
	"github.com/overage-billing/overage/internal/testkit/flakyproxy"
	"github.com/overage-billing/overage/meters"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/usagelog"
)

// The faults of the demo. demoStripeFaults are drawn per Stripe call by
// the emulator; demoLostAnswerRate per API request by the proxy in front
// of the API.
var demoStripeFaults = emulator.Faults{
	LostResponseRate: 0.10, ServerErrorRate: 0.05, RateLimitRate: 0.05, Latency: 2 * time.Millisecond,
}

const (
	demoLostAnswerRate = 10 // one API answer in this many is lost
	// demoReportBatchMax is REPORT_BATCH_MAX in the demo: 300 events make
	// about 50 reports of two meter events each.
	demoReportBatchMax = 5
)

// demoMeters are the meters the demo adds beside the two default ones: a
// per-model meter for gpt-4o's input and one for cached input read, of
// every model. Created once and reused, like the tenants.
var demoMeters = []meters.CreateParams{
	{Key: "demo_gpt4o_input", EventName: "demo_gpt4o_input_tokens", TokenType: overage.TokenInput, Models: []string{"gpt-4o"}},
	{Key: "demo_cache_read", EventName: "demo_cache_read_tokens", TokenType: overage.TokenCacheRead, Models: []string{"*"}},
}

// demoTenants are the demo's tenants. They are found by name and Stripe
// customer and reused, so running the demo again adds none; each run's
// events carry a request_id prefix of their own (demo.run), and the
// closing tables count only those.
var demoTenants = []tenants.CreateParams{
	{Name: "Acme (demo)", StripeCustomerID: "cus_demo_acme"},
	{Name: "Globex (demo)", StripeCustomerID: "cus_demo_globex", IncludedInputTokens: 100_000, IncludedOutputTokens: 20_000},
}

// demo sends a burst of usage from two tenants through the Go client, over
// a proxy that loses some answers after the server committed, retries and
// duplicates some requests on purpose, waits for the workers to bill it,
// and shows that the emulator and the database agree.
type demo struct {
	pool    *pgxpool.Pool
	emu     *emulator.Emulator
	baseURL string
	out     io.Writer
	events  int
	tty     bool
	logger  *slog.Logger
	// The meter event names the workers report under.
	inputEvent, outputEvent string
	batchMax                int
	// sweep queues a sweep job; sweepGrace is how long a log waits before
	// a sweep requeues it.
	sweep      func(context.Context) error
	sweepGrace time.Duration

	// runPrefix starts the request_id of every event of this run.
	runPrefix string
	tenants   []demoTenant
	keys      []string

	proxy *flakyproxy.Proxy
	// What the emulator held before this run's burst: a database shared
	// with an earlier, interrupted run may have had logs of that run
	// reported to this emulator first.
	emuRequestsBefore, emuEventsBefore int

	sent, accepted, replays, duplicates atomic.Int64
}

type demoTenant struct {
	id       uuid.UUID
	name     string
	customer string
}

func (d *demo) tenantIDs() []uuid.UUID {
	ids := make([]uuid.UUID, len(d.tenants))
	for i, t := range d.tenants {
		ids[i] = t.id
	}
	return ids
}

func (d *demo) run(ctx context.Context) error {
	// Unique per run: the demo tenants keep the logs of earlier runs,
	// whose request_ids would otherwise make these duplicates.
	d.runPrefix = fmt.Sprintf("demo-%s-%04x-", time.Now().UTC().Format("20060102T150405"), rand.IntN(1<<16))
	if err := d.meters(ctx); err != nil {
		return err
	}
	for _, p := range demoTenants {
		if err := d.tenant(ctx, p); err != nil {
			return err
		}
	}
	if err := d.drainEarlierRuns(ctx); err != nil {
		return err
	}
	d.emuRequestsBefore, d.emuEventsBefore = len(d.emu.Requests()), len(d.emu.Events())

	proxy, err := flakyproxy.New(d.baseURL, func() flakyproxy.Fault {
		if rand.IntN(demoLostAnswerRate) == 0 {
			return flakyproxy.DropAfterCommit
		}
		return flakyproxy.None
	})
	if err != nil {
		return err
	}
	d.proxy = proxy
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	psrv := &http.Server{Handler: proxy}
	go func() { _ = psrv.Serve(ln) }()
	defer psrv.Close()

	f := d.emu.Faults()
	fmt.Fprintf(d.out, "sending %d usage events through the Go client; the network loses 1 API answer in %d after the server committed it\n", d.events, demoLostAnswerRate)
	fmt.Fprintf(d.out, "the Stripe emulator loses the answer to %s of the events it applies, and answers %s of calls 500 and %s 429;\n", pct(f.LostResponseRate), pct(f.ServerErrorRate), pct(f.RateLimitRate))
	fmt.Fprintf(d.out, "reports hold at most %s (REPORT_BATCH_MAX), so that Stripe gets enough calls for these faults to happen\n", plural(int64(d.batchMax), "usage log", "usage logs"))
	progressDone := make(chan struct{})
	stopProgress := d.progress(ctx, progressDone)
	err = d.send(ctx, "http://"+ln.Addr().String())
	if err == nil {
		err = d.waitBilled(ctx, "every demo usage log to leave pending")
	}
	stopProgress()
	<-progressDone
	if err != nil {
		return err
	}
	return d.report(ctx)
}

// tenant finds the demo tenant p by name and customer, or creates it, and
// gives this run a new API key (only a key's hash is stored, so an earlier
// run's key cannot be shown again). The demo's earlier keys are revoked,
// so they do not pile up either.
// meters creates the demo's meters unless they exist (an earlier run made
// them). A meter archived since is left archived: the demo then bills its
// tokens where the routing sends them.
func (d *demo) meters(ctx context.Context) error {
	store := meters.NewStore(d.pool, d.inputEvent, d.outputEvent)
	existing, err := store.List(ctx)
	if err != nil {
		return err
	}
	for _, p := range demoMeters {
		if slices.ContainsFunc(existing, func(m overage.Meter) bool { return m.Key == p.Key }) {
			continue
		}
		if _, err := store.Create(ctx, p); err != nil {
			return fmt.Errorf("the demo's meter %s: %w", p.Key, err)
		}
	}
	return nil
}

// eventNames are the meter event names the closing table lists: the
// default meters', then the demo's.
func (d *demo) eventNames() []string {
	out := []string{d.inputEvent, d.outputEvent}
	for _, m := range demoMeters {
		out = append(out, m.EventName)
	}
	return out
}

func (d *demo) tenant(ctx context.Context, p tenants.CreateParams) error {
	store := tenants.NewStore(d.pool)
	id, reused, err := store.Find(ctx, p.Name, p.StripeCustomerID)
	if err != nil {
		return fmt.Errorf("find demo tenant %s: %w", p.Name, err)
	}
	var key string
	if !reused {
		c, err := store.Create(ctx, p)
		if err != nil {
			return fmt.Errorf("create demo tenant %s: %w", p.Name, err)
		}
		id, key = c.ID, c.APIKey
	} else {
		k, err := store.AddKey(ctx, id)
		if err != nil {
			return fmt.Errorf("new API key of demo tenant %s: %w", p.Name, err)
		}
		key = k.Key
		if err := store.RevokeOtherKeys(ctx, id, k.ID); err != nil {
			return fmt.Errorf("revoke earlier API keys of demo tenant %s: %w", p.Name, err)
		}
	}
	t, err := store.Show(ctx, id)
	if err != nil {
		return err
	}
	d.tenants = append(d.tenants, demoTenant{id: id, name: t.Name, customer: t.StripeCustomerID})
	d.keys = append(d.keys, key)

	allowance := "no allowance: all usage is overage"
	if t.IncludedInputTokens > 0 || t.IncludedOutputTokens > 0 {
		allowance = fmt.Sprintf("%s input and %s output tokens included a month", thousands(t.IncludedInputTokens), thousands(t.IncludedOutputTokens))
		if reused {
			// Earlier runs this month used some of it: say what is left,
			// or the table's "within the allowance" row would puzzle.
			// The tenant's usage as GET /v1/usage reads it, of this month
			// in UTC.
			now := time.Now().UTC()
			month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
			u, err := alerts.ReadUsage(ctx, d.pool, id, &month, nil)
			if err != nil {
				return fmt.Errorf("allowance of demo tenant %s: %w", p.Name, err)
			}
			var in, out int64
			for _, m := range u.Meters {
				switch m.Meter {
				case overage.MeterInput:
					in = m.Used
				case overage.MeterOutput:
					out = m.Used
				}
			}
			leftIn, leftOut := max(0, t.IncludedInputTokens-in), max(0, t.IncludedOutputTokens-out)
			if leftIn == 0 && leftOut == 0 {
				allowance += ", used up by earlier runs this month: all usage is overage"
			} else {
				allowance += fmt.Sprintf(", of which earlier runs this month left %s input and %s output", thousands(leftIn), thousands(leftOut))
			}
		}
	}
	how := "created"
	if reused {
		how = "reused"
	}
	fmt.Fprintf(d.out, "tenant %-14s %-16s %s, API key %s  (%s)\n", t.Name, t.StripeCustomerID, how, key, allowance)
	return nil
}

// drainEarlierRuns waits for logs an interrupted earlier run left pending:
// the workers report them to this run's emulator, before the burst, so
// they cannot mix into this run's reports.
func (d *demo) drainEarlierRuns(ctx context.Context) error {
	n, err := usagelog.CountInStatus(ctx, d.pool, d.tenantIDs(), overage.BillingStatusPending)
	if err != nil {
		return fmt.Errorf("count pending demo usage logs: %w", err)
	}
	if n == 0 {
		return nil
	}
	fmt.Fprintf(d.out, "an earlier demo run left %s pending; reporting %s first\n", plural(n, "usage log", "usage logs"), map[bool]string{true: "it", false: "them"}[n == 1])
	if err := d.sweep(ctx); err != nil {
		return fmt.Errorf("queue a sweep: %w", err)
	}
	return d.waitBilled(ctx, "the usage logs of earlier demo runs to leave pending")
}

func (d *demo) send(ctx context.Context, url string) error {
	clients := make([]*client.Client, len(d.keys))
	for i, k := range d.keys {
		c, err := client.New(client.Config{BaseURL: url, APIKey: k, BaseDelay: 20 * time.Millisecond, MaxDelay: time.Second})
		if err != nil {
			return err
		}
		clients[i] = c
	}
	work := make(chan int)
	errc := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				c := clients[i%len(clients)]
				ev := client.UsageEvent{
					RequestID: fmt.Sprintf("%s%d", d.runPrefix, i), UserID: fmt.Sprintf("user-%d", i%17), ModelID: []string{"gpt-4o", "claude-sonnet", "llama-70b"}[i%3],
					InputTokens: int64(800 + (i*7919)%2400), OutputTokens: int64(150 + (i*104729)%600),
					// Two calls in three read part of their prompt from the
					// provider's cache: billed on the demo's cache-read meter.
					CacheReadInputTokens: cacheRead(i),
					// Fixed once: a resend of the same operation is the same body.
					Timestamp: time.Now().UTC().Truncate(time.Microsecond),
				}
				// Every tenth event is sent twice under its key (an app
				// server retrying after a timeout): the second is a replay.
				// Every fifteenth is sent again under a new key (a buggy
				// retry): its request_id makes it a duplicate.
				sends := []string{ev.RequestID}
				if i%10 == 0 {
					sends = append(sends, ev.RequestID)
				}
				if i%15 == 0 {
					sends = append(sends, ev.RequestID+"-again")
				}
				for n, key := range sends {
					d.sent.Add(1)
					res, err := c.Record(ctx, ev, &client.RecordOpts{IdempotencyKey: key})
					if err != nil {
						errc <- fmt.Errorf("demo event %d: %w", i, err)
						return
					}
					switch {
					case n == 0:
						d.accepted.Add(1)
					case res.Duplicate:
						d.duplicates.Add(1)
					case res.Replayed:
						d.replays.Add(1)
					}
				}
			}
		}()
	}
	for i := range d.events {
		select {
		case work <- i:
		case err := <-errc:
			close(work)
			wg.Wait()
			return err
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// runLogs are this run's usage logs of each demo tenant, by billing status.
type runLogs map[uuid.UUID]map[string]int64

func (l runLogs) total(status string) int64 {
	var n int64
	for _, byStatus := range l {
		n += byStatus[status]
	}
	return n
}

// counts returns this run's usage logs by tenant and billing status.
func (d *demo) counts(ctx context.Context) (runLogs, error) {
	byTenant, err := usagelog.CountRunByStatus(ctx, d.pool, d.tenantIDs(), d.runPrefix)
	if err != nil {
		return nil, fmt.Errorf("count the demo's usage logs: %w", err)
	}
	out := runLogs{}
	for _, t := range d.tenants {
		out[t.id] = map[string]int64{}
		for status, n := range byTenant[t.id] {
			out[t.id][string(status)] = n
		}
	}
	return out, nil
}

// progress redraws one status line in place on a terminal, and prints a
// plain line every two seconds otherwise.
func (d *demo) progress(ctx context.Context, done chan<- struct{}) func() {
	pctx, cancel := context.WithCancel(ctx)
	every := 2 * time.Second
	if d.tty {
		every = 200 * time.Millisecond
	}
	line := func() string {
		c, err := d.counts(ctx)
		if err != nil {
			// A line without counts, saying why: the wait for billing
			// reports the error itself if it persists.
			return fmt.Sprintf("sent %d  accepted %d  (cannot count the logs: %v)", d.sent.Load(), d.accepted.Load(), err)
		}
		return fmt.Sprintf("sent %d  accepted %d  billed %d  within the allowance %d  pending %d",
			d.sent.Load(), d.accepted.Load(), c.total(string(overage.BillingStatusBilled)), c.total(string(overage.BillingStatusNotBillable)), c.total(string(overage.BillingStatusPending)))
	}
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				if d.tty {
					fmt.Fprintf(d.out, "\r\033[K%s\n", line())
				} else {
					fmt.Fprintln(d.out, line())
				}
				return
			case <-t.C:
				if d.tty {
					fmt.Fprintf(d.out, "\r\033[K%s", line())
				} else {
					fmt.Fprintln(d.out, line())
				}
			}
		}
	}()
	return cancel
}

// waitBilled polls until no log of the demo tenants is pending. A report
// job that met several injected faults in a row spends its attempts and is
// discarded, leaving its tenant's remaining logs to the sweep: while logs
// wait, the demo asks for a sweep every grace period, as a production
// sweep would after SWEEP_INTERVAL.
func (d *demo) waitBilled(ctx context.Context, what string) error {
	lastSweep := time.Now()
	return poll.Wait(ctx, what, 3*time.Minute, 100*time.Millisecond, func() (bool, error) {
		pending, err := usagelog.CountInStatus(ctx, d.pool, d.tenantIDs(), overage.BillingStatusPending)
		if err != nil {
			return false, fmt.Errorf("count pending demo usage logs: %w", err)
		}
		if pending > 0 && time.Since(lastSweep) >= d.sweepGrace {
			lastSweep = time.Now()
			d.logger.InfoContext(ctx, "demo: queueing a sweep", "pending_usage_logs", pending)
			if err := d.sweep(ctx); err != nil {
				return false, fmt.Errorf("queue a sweep: %w", err)
			}
		}
		return pending == 0, nil
	})
}

// billedByMeter returns this run's billed overage per Stripe customer and
// meter event name, in the emulator's shape.
func (d *demo) billedByMeter(ctx context.Context) (map[emulator.AppliedKey]int64, error) {
	totals, err := usagelog.BilledTotals(ctx, d.pool, d.tenantIDs(), d.runPrefix)
	if err != nil {
		return nil, fmt.Errorf("the demo's billed totals: %w", err)
	}
	cat, err := meters.NewStore(d.pool, d.inputEvent, d.outputEvent).Catalog(ctx, d.pool)
	if err != nil {
		return nil, err
	}
	billed := map[emulator.AppliedKey]int64{}
	for k, n := range totals {
		m, ok := cat.Meter(k.Meter)
		if !ok {
			return nil, fmt.Errorf("the demo's billed totals: usage logs name the meter %q, which the catalog does not hold", k.Meter)
		}
		billed[emulator.AppliedKey{Customer: k.Customer, EventName: m.EventName}] += n
	}
	return billed, nil
}

// report prints the closing tables — what the client sent, the usage logs
// stored, the calls Stripe got, and the tokens each side holds per meter —
// and checks the database against the emulator: any disagreement is an
// error.
func (d *demo) report(ctx context.Context) error {
	logs, err := d.counts(ctx)
	if err != nil {
		return err
	}
	lost := int64(0)
	seen := d.proxy.Seen()
	for _, s := range seen {
		if s.Fault == flakyproxy.DropAfterCommit {
			lost++
		}
	}
	billed, err := d.billedByMeter(ctx)
	if err != nil {
		return err
	}
	events := d.emu.Events()[d.emuEventsBefore:]
	applied := map[emulator.AppliedKey]int64{}
	twice := ""
	for _, e := range events {
		applied[emulator.AppliedKey{Customer: e.Customer, EventName: e.EventName}] += e.Value
		if n := d.emu.AppliedCount(e.Identifier); n != 1 && twice == "" {
			twice = fmt.Sprintf("the emulator applied %s %d times", e.Identifier, n)
		}
	}
	calls := map[string]int64{}
	for _, r := range d.emu.Requests()[d.emuRequestsBefore:] {
		if r.EventName != "" { // meter events only
			calls[r.Outcome]++
		}
	}

	fmt.Fprintln(d.out)
	writeRows(d.out, requestRows(d.accepted.Load(), d.replays.Load(), d.duplicates.Load(), lost, int64(len(seen))))
	fmt.Fprintln(d.out)
	writeRows(d.out, logRows(d.tenants, logs))
	fmt.Fprintln(d.out)
	writeRows(d.out, callRows(calls, d.emu.Faults(), int64(len(events))))
	fmt.Fprintln(d.out)
	rows, agree := meterRows(d.tenants, d.eventNames(), billed, applied)
	writeRows(d.out, rows)

	var problems []string
	if !agree {
		problems = append(problems, "the tokens per customer and meter differ")
	}
	if twice != "" {
		problems = append(problems, twice)
	}
	if n := logs.total(string(overage.BillingStatusBilled)) + logs.total(string(overage.BillingStatusNotBillable)); n != d.accepted.Load() {
		problems = append(problems, fmt.Sprintf("%s accepted but %d billed or within the allowance", plural(d.accepted.Load(), "event", "events"), n))
	}
	if len(problems) > 0 {
		return fmt.Errorf("the emulator and the database disagree: %s", strings.Join(problems, "; "))
	}
	fmt.Fprintf(d.out, "\nevery demo event billed exactly once: the emulator's totals equal the database's\n")
	return nil
}

// cacheRead is the cached input of the demo's i-th event: none for one in
// three, else a few hundred tokens (less than the event's smallest input).
func cacheRead(i int) int64 {
	if i%3 == 2 {
		return 0
	}
	return int64(100 + (i*31)%500)
}
