//go:build dev

// Command expiry checks that the idempotency records' expiry keeps up with
// ingest (issue 18): benchmark tenants offer batches at a fixed rate (open
// loop, as bench/e2e) to one `overage serve` for a fixed time, one
// `overage work` bills them to the Stripe emulator and keeps the
// partitions, and every -sample it reads
//
//   - the partitions wholly expired (upper bound + DropMargin passed) still
//     attached, and the records in them: the expired backlog;
//   - the live records (expires_at > now());
//
// and the CPU time of `work`'s maintenance backends (the PostgreSQL
// backends of its maintenance pool, application_name
// app.MaintenanceAppName, read from /proc: PostgreSQL must run on this
// machine) against the run's seconds times the machine's cores: the share
// of the machine maintenance took, the goal. It prints, beside it, the
// wall time of the maintenance queue's jobs (attempted_at to
// finalized_at: an upper bound, counting a job that waits for a lock or a
// core as busy) and all of work's own CPU, where maintenance's Go side is
// (its statements' waiting, not separable from billing's), events/s
// ingested and billed per -window and a PASS or FAIL line per goal, and
// exits 1 on a FAIL.
//
// Built with -tags dev and run with OVERAGE_DEV_IDEMPOTENCY_WIDTH set, as
// bench/expiry.sh does, so that it and the processes it starts share the
// compressed layout (idempotency/layout_dev.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/bench/internal/benchkit"
	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

type params struct {
	dbURL, bin, addr   string
	tenants, batch     int
	rate               float64
	duration, latency  time.Duration
	sample, window     time.Duration
	workers, rateLimit int
	maxShare, minRate  float64
}

func main() {
	var p params
	flag.StringVar(&p.dbURL, "database-url", os.Getenv("DATABASE_URL"), "migrated database holding bench/setup.sql's tenants and nothing else")
	flag.StringVar(&p.bin, "bin", "./bin/overage-dev", "the overage binary (the development build, for the compressed layout)")
	flag.StringVar(&p.addr, "addr", "127.0.0.1:18083", "where overage serve listens")
	flag.IntVar(&p.tenants, "tenants", 100, "tenants sending (API keys benchkit.BenchKey(1..N))")
	flag.IntVar(&p.batch, "batch", 100, "events per batch (one idempotency record a batch)")
	flag.Float64Var(&p.rate, "rate", 10000, "events per second offered, across all tenants")
	flag.DurationVar(&p.duration, "duration", 600*time.Second, "how long to offer")
	flag.DurationVar(&p.latency, "latency", 5*time.Millisecond, "emulator latency per call")
	flag.DurationVar(&p.sample, "sample", 5*time.Second, "how often the partitions are read")
	flag.DurationVar(&p.window, "window", 30*time.Second, "the windows of events/s ingested and billed")
	flag.IntVar(&p.workers, "workers", 200, "REPORT_WORKERS of the work process")
	flag.IntVar(&p.rateLimit, "rate-limit", 1000, "STRIPE_RATE_LIMIT of the work process")
	flag.Float64Var(&p.maxShare, "max-share", 0.05, "the goal: maintenance's share of the machine below this")
	flag.Float64Var(&p.minRate, "min-ingest", 0.95, "ingested events/s at least this share of the offer, for the run to be at the offered load")
	flag.Parse()
	ok, err := run(p)
	if err != nil {
		log.Fatal(err)
	}
	if !ok {
		os.Exit(1)
	}
}

// sample is one reading of the partitions.
type sample struct {
	at                    time.Duration // since the offer began
	partitions            int
	expiredAttached       int   // wholly expired, upper + margin passed, still attached
	expiredRows, liveRows int64 // records in those; records not expired
}

func run(p params) (bool, error) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, p.dbURL)
	if err != nil {
		return false, err
	}
	defer pool.Close()
	fmt.Printf("layout: partitions %v wide, records kept %v, dropped %v after their last expiry, maintenance every %v, %d ahead\n",
		idempotency.Width, idempotency.TTL, idempotency.DropMargin, idempotency.MaintainEvery, idempotency.Ahead)

	emu := emulator.New(emulator.Options{Faults: emulator.Faults{Latency: p.latency}})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		return false, err
	}
	defer emu.Close()
	serve, err := benchkit.StartServe(p.bin, p.dbURL, p.addr)
	if err != nil {
		return false, err
	}
	serveStopped := false
	defer func() {
		if !serveStopped {
			serve.Stop()
		}
	}()
	work, err := benchkit.StartWork(benchkit.WorkOpts{Bin: p.bin, DatabaseURL: p.dbURL, StripeBase: base, RateLimit: p.rateLimit, Workers: p.workers})
	if err != nil {
		return false, err
	}
	workStopped := false
	defer func() {
		if !workStopped {
			work.Stop()
		}
	}()

	var dbStart time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbStart); err != nil {
		return false, err
	}
	start := time.Now()
	busy0, total0 := benchkit.MachineCPU()
	// The maintenance backends' CPU: a snapshot at the start (what they
	// used before it is not the run's), one each sample and one at the
	// end; a backend gone between two counts up to its last.
	cpu0, err := benchkit.BackendCPUOf(ctx, pool, app.MaintenanceAppName)
	if err != nil {
		return false, err
	}
	cpuSnaps := []map[int]time.Duration{cpu0}

	// The sampler runs from the first batch to the last billed.
	var (
		smu     sync.Mutex
		samples []sample
		maxRows = map[string]int64{} // the most records seen in each partition
		seen    = map[string]bool{}
	)
	sctx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	sampled := make(chan error, 1)
	go func() {
		t := time.NewTicker(p.sample)
		defer t.Stop()
		for {
			s, rows, err := read(sctx, pool)
			var snap map[int]time.Duration
			if err == nil {
				snap, err = benchkit.BackendCPUOf(sctx, pool, app.MaintenanceAppName)
			}
			if sctx.Err() != nil {
				sampled <- nil
				return
			}
			if err != nil {
				sampled <- err
				return
			}
			s.at = time.Since(start)
			smu.Lock()
			cpuSnaps = append(cpuSnaps, snap)
			samples = append(samples, s)
			for name, n := range rows {
				seen[name] = true
				maxRows[name] = max(maxRows[name], n)
			}
			smu.Unlock()
			fmt.Printf("t=%4.0fs partitions %2d  wholly expired attached %d (%d records)  live records %d\n",
				s.at.Seconds(), s.partitions, s.expiredAttached, s.expiredRows, s.liveRows)
			select {
			case <-sctx.Done():
				sampled <- nil
				return
			case <-t.C:
			}
		}
	}()

	acks, batches := offer(p, start)
	lastAck := start
	for _, a := range acks {
		lastAck = later(lastAck, a)
	}
	serve.Stop()
	serveStopped = true
	// Billing is given 5 minutes after the last answer to finish; a run
	// it does not finish in still reports the rest (its billing goal then
	// fails), since the backlog and maintenance goals are judged either way.
	for {
		var pending bool
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM usage_logs WHERE billing_status = 'pending')").Scan(&pending); err != nil {
			return false, err
		}
		if !pending {
			break
		}
		if time.Since(lastAck) > 5*time.Minute {
			fmt.Println("logs still pending 5 minutes after the last batch was acknowledged: reporting the run as it stands")
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	stopSampling()
	if err := <-sampled; err != nil {
		return false, fmt.Errorf("sample the partitions: %w", err)
	}
	elapsed := time.Since(start)
	busy1, total1 := benchkit.MachineCPU()
	cpu1, err := benchkit.BackendCPUOf(ctx, pool, app.MaintenanceAppName)
	if err != nil {
		return false, err
	}
	maintCPU := benchkit.SumCPU(append(cpuSnaps, cpu1)...) - benchkit.SumCPU(cpu0)
	maintBackends := len(cpu1)
	var dbEnd time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbEnd); err != nil {
		return false, err
	}
	maint, err := maintenance(ctx, pool, dbStart, dbEnd)
	if err != nil {
		return false, err
	}
	workCPU := work.Stop()
	workStopped = true

	// The windows: acknowledged events by the client's clock, billed ones
	// by billed_at, both from the start of the offer.
	nw := int(elapsed/p.window) + 1
	ingested, billed := make([]int64, nw), make([]int64, nw)
	for _, a := range acks {
		ingested[min(int(a.Sub(start)/p.window), nw-1)] += int64(p.batch)
	}
	var logs, billedLogs int64
	rows, err := pool.Query(ctx, `SELECT floor(extract(epoch FROM billed_at - $1) / $2)::int, count(*)
		FROM usage_logs WHERE billing_status = 'billed' GROUP BY 1`, dbStart, p.window.Seconds())
	if err != nil {
		return false, err
	}
	for rows.Next() {
		var w int
		var n int64
		if err := rows.Scan(&w, &n); err != nil {
			return false, err
		}
		billed[max(0, min(w, nw-1))] += n
		billedLogs += n
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs`).Scan(&logs); err != nil {
		return false, err
	}
	fmt.Printf("\n%-12s %12s %12s\n", "window", "ingested/s", "billed/s")
	for i := range nw {
		span := p.window
		if i == nw-1 {
			span = elapsed - time.Duration(i)*p.window
		}
		fmt.Printf("%5.0f-%-5.0fs %12.0f %12.0f\n", (time.Duration(i) * p.window).Seconds(), (time.Duration(i)*p.window + span).Seconds(),
			float64(ingested[i])/span.Seconds(), float64(billed[i])/span.Seconds())
	}

	// The partitions that went during the run: seen in a sample, gone at
	// the end; those that held records among them.
	var now []string
	ps, err := idempotency.Partitions(ctx, pool)
	if err != nil {
		return false, err
	}
	present := map[string]bool{}
	for _, p := range ps {
		present[p.Name] = true
		now = append(now, p.Name)
	}
	var dropped, droppedFull int
	var droppedRows int64
	for name := range seen {
		if !present[name] {
			dropped++
			if maxRows[name] > 0 {
				droppedFull++
				droppedRows += maxRows[name]
			}
		}
	}
	worst, worstRows := 0, int64(0)
	var peakLive int64
	for _, s := range samples {
		worst, worstRows, peakLive = max(worst, s.expiredAttached), max(worstRows, s.expiredRows), max(peakLive, s.liveRows)
	}

	cores := runtime.NumCPU()
	machine := elapsed.Seconds() * float64(cores)
	share := maintCPU.Seconds() / machine
	wallShare := maint.total.Seconds() / machine
	events := int64(len(acks)) * int64(p.batch)
	ingestRate := float64(events) / lastAck.Sub(start).Seconds()
	fmt.Printf("\nrun %.0f s (offer %v), %d cores, machine busy %.0f%%; %d batches offered, %d acknowledged (%d events), %d usage logs, %d billed\n",
		elapsed.Seconds(), p.duration, cores, 100*ratio(busy1-busy0, total1-total0), batches, len(acks), events, logs, billedLogs)
	fmt.Printf("ingested %.0f events/s of %.0f offered; billed %.0f events/s over the run\n", ingestRate, p.rate, float64(billedLogs)/elapsed.Seconds())
	fmt.Printf("partitions: %d samples; %d dropped during the run, %d of them with records (%d records, the most seen in each); attached now %v\n",
		len(samples), dropped, droppedFull, droppedRows, now)
	fmt.Printf("maintenance jobs (queue %s, attempted_at to finalized_at, or to the end if still running):\n", outbox.QueueMaintenance)
	for _, k := range maint.kinds {
		fmt.Printf("  %-36s %5d runs  %8.2f s  mean %6.1f ms  max %7.1f ms\n", k.kind, k.runs, k.wall.Seconds(),
			float64(k.wall.Milliseconds())/float64(max(k.runs, 1)), float64(k.max.Microseconds())/1000)
	}
	fmt.Printf("  total %.2f s over %.0f s x %d cores = %.3f%% of the machine by wall time (an upper bound: waits count)\n",
		maint.total.Seconds(), elapsed.Seconds(), cores, 100*wallShare)
	fmt.Printf("maintenance backends (application_name %s, %d at the end): CPU %.2f s = %.3f%% of the machine; all of work's own CPU (billing's Go side and maintenance's) %.1f s = %.1f%%\n",
		app.MaintenanceAppName, maintBackends, maintCPU.Seconds(), 100*share, workCPU.Seconds(), 100*workCPU.Seconds()/machine)

	ok := true
	goal := func(pass bool, format string, args ...any) {
		verdict := "PASS"
		if !pass {
			verdict, ok = "FAIL", false
		}
		fmt.Printf("%s %s\n", verdict, fmt.Sprintf(format, args...))
	}
	goal(droppedFull >= 1, "expiry happened: %d partitions holding records dropped during the run (want >= 1)", droppedFull)
	goal(worst <= 1, "expired backlog: at most %d wholly expired partitions attached (%d records) in %d samples (want <= 1)", worst, worstRows, len(samples))
	goal(len(cpuSnaps) > 1 && maintBackends > 0, "maintenance backends measured: %d snapshots, %d backends named %s at the end (PostgreSQL on this machine)", len(cpuSnaps), maintBackends, app.MaintenanceAppName)
	goal(share < p.maxShare, "maintenance share: its backends' CPU %.3f%% of the machine (want < %.0f%%)", 100*share, 100*p.maxShare)
	goal(ingestRate >= p.minRate*p.rate, "offered load: %.0f events/s ingested of %.0f offered (want >= %.0f%%)", ingestRate, p.rate, 100*p.minRate)
	goal(billedLogs == logs && logs >= events, "everything acknowledged billed: %d events acknowledged, %d logs, %d billed", events, logs, billedLogs)
	fmt.Printf("peak live records %d\n", peakLive)
	return ok, nil
}

// read samples the partitions: each one's records by one scan of the
// table (ingest's records are few a partition: one a batch), and which are
// wholly expired by the database's clock.
func read(ctx context.Context, pool *pgxpool.Pool) (sample, map[string]int64, error) {
	var s sample
	ps, err := idempotency.Partitions(ctx, pool)
	if err != nil {
		return s, nil, err
	}
	rows, err := pool.Query(ctx, `SELECT tableoid::regclass::text, count(*), count(*) FILTER (WHERE expires_at > now()), now()
		FROM idempotency_keys GROUP BY 1`)
	if err != nil {
		return s, nil, err
	}
	counts := map[string]int64{}
	var now time.Time
	for rows.Next() {
		var name string
		var n, live int64
		if err := rows.Scan(&name, &n, &live, &now); err != nil {
			return s, nil, err
		}
		counts[name] = n
		s.liveRows += live
	}
	if err := rows.Err(); err != nil {
		return s, nil, err
	}
	if now.IsZero() {
		if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return s, nil, err
		}
	}
	s.partitions = len(ps)
	for _, p := range ps {
		if _, ok := counts[p.Name]; !ok {
			counts[p.Name] = 0
		}
		if !p.Upper.Add(idempotency.DropMargin).After(now) {
			s.expiredAttached++
			s.expiredRows += counts[p.Name]
		}
	}
	return s, counts, nil
}

type kindTime struct {
	kind      string
	runs      int
	wall, max time.Duration
}

type maint struct {
	kinds []kindTime
	total time.Duration
}

// maintenance sums the wall time of the maintenance queue's jobs run
// between from and to, by kind.
func maintenance(ctx context.Context, pool *pgxpool.Pool, from, to time.Time) (maint, error) {
	var m maint
	rows, err := pool.Query(ctx, `SELECT kind, count(*),
			coalesce(sum(extract(epoch FROM least(coalesce(finalized_at, $3), $3) - greatest(attempted_at, $2))), 0)::float8,
			coalesce(max(extract(epoch FROM least(coalesce(finalized_at, $3), $3) - greatest(attempted_at, $2))), 0)::float8
		FROM river_job
		WHERE queue = $1 AND attempted_at IS NOT NULL AND attempted_at < $3 AND coalesce(finalized_at, $3) > $2
		GROUP BY kind ORDER BY kind`, outbox.QueueMaintenance, from, to)
	if err != nil {
		return m, fmt.Errorf("maintenance jobs: %w", err)
	}
	kinds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kindTime, error) {
		var k kindTime
		var wall, most float64
		err := r.Scan(&k.kind, &k.runs, &wall, &most)
		k.wall, k.max = time.Duration(wall*float64(time.Second)), time.Duration(most*float64(time.Second))
		return k, err
	})
	if err != nil {
		return m, fmt.Errorf("maintenance jobs: %w", err)
	}
	sort.Slice(kinds, func(i, j int) bool { return kinds[i].wall > kinds[j].wall })
	for _, k := range kinds {
		m.total += k.wall
	}
	m.kinds = kinds
	return m, nil
}

// offer sends the batches, open loop as bench/e2e (benchkit.Offer). It
// returns when each 202 came, and how many batches were sent.
func offer(p params, start time.Time) ([]time.Time, int64) {
	var (
		mu    sync.Mutex
		acks  []time.Time
		total atomic.Int64
	)
	o := benchkit.Offer{Addr: p.addr, Tenants: p.tenants, Batch: p.batch, Rate: p.rate, Duration: p.duration,
		Event: benchkit.DefaultEvent, KeyPrefix: "expiry-"}
	o.Run(start, func(_ int64, status int, err error, at time.Time) {
		total.Add(1)
		if err == nil && status == http.StatusAccepted {
			mu.Lock()
			acks = append(acks, at)
			mu.Unlock()
		}
	})
	return acks, total.Load()
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func ratio(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
