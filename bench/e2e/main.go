// Command e2e measures the pipeline end to end: benchmark tenants send
// batches at a fixed offered rate (open loop: a slow answer does not slow
// the offer) to one `overage serve` for a fixed time, while one `overage
// work` reports to the Stripe emulator with its latency, Stripe's 1,000
// calls/s per account and one call at a time per customer and meter. When
// everything acknowledged is billed, it prints one JSON line: events/s
// ingested and billed, meter-event calls/s (mean and busiest second), and
// the lag from the client's acknowledgement to billed (p50, p99) — each
// usage log's billed_at against the time its batch's 202 reached the
// client, both read from this machine's clock — and, for comparison, from
// the log's created_at (its ingest transaction's start) to billed_at.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/bench/internal/benchkit"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

type params struct {
	dbURL, bin, addr   string
	tenants, batch     int
	rate               float64
	duration, latency  time.Duration
	workers, rateLimit int
	event              benchkit.Event
}

func main() {
	var p params
	flag.StringVar(&p.dbURL, "database-url", os.Getenv("DATABASE_URL"), "migrated database holding bench/setup.sql's tenants and nothing else")
	flag.StringVar(&p.bin, "bin", "./bin/overage", "the overage binary")
	flag.StringVar(&p.addr, "addr", "127.0.0.1:18081", "where overage serve listens")
	flag.IntVar(&p.tenants, "tenants", 100, "tenants sending (API keys benchkit.BenchKey(1..N))")
	flag.IntVar(&p.batch, "batch", 100, "events per batch")
	flag.Float64Var(&p.rate, "rate", 10000, "events per second offered, across all tenants")
	flag.DurationVar(&p.duration, "duration", 30*time.Second, "how long to offer")
	flag.DurationVar(&p.latency, "latency", 5*time.Millisecond, "emulator latency per call")
	flag.IntVar(&p.workers, "workers", 200, "REPORT_WORKERS of the work process")
	flag.IntVar(&p.rateLimit, "rate-limit", 1000, "STRIPE_RATE_LIMIT of the work process; the emulator enforces Stripe's 1,000/s per account")
	flag.StringVar(&p.event.Model, "model", benchkit.DefaultEvent.Model, "model_id of every event")
	flag.IntVar(&p.event.CacheRead, "cache-read", 0, "cache_read_input_tokens of every event (of its 1,200 input tokens); 0 sends none")
	flag.Parse()
	if err := run(p); err != nil {
		log.Fatal(err)
	}
}

// ack is one batch the server answered 202, and when the answer came.
type ack struct {
	seq int64
	at  time.Time
}

func run(p params) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, p.dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	emu := emulator.New(emulator.Options{Faults: emulator.Faults{Latency: p.latency}})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer emu.Close()
	serve, err := benchkit.StartServe(p.bin, p.dbURL, p.addr)
	if err != nil {
		return err
	}
	serveStopped := false
	var serveCPU time.Duration
	defer func() {
		if !serveStopped {
			serve.Stop()
		}
	}()
	work, err := benchkit.StartWork(benchkit.WorkOpts{Bin: p.bin, DatabaseURL: p.dbURL, StripeBase: base, RateLimit: p.rateLimit, Workers: p.workers})
	if err != nil {
		return err
	}
	defer work.Stop()

	// The open-loop offer of benchkit.Offer: each tenant a batch every
	// interval, staggered; a late answer sends the next batch at once.
	var (
		mu       sync.Mutex
		acks     []ack
		statuses = map[int]int{}
		failed   int
		sentN    int64
	)
	busy0, total0 := benchkit.MachineCPU()
	start := time.Now()
	o := benchkit.Offer{Addr: p.addr, Tenants: p.tenants, Batch: p.batch, Rate: p.rate, Duration: p.duration,
		Event: p.event, KeyPrefix: "e2e-"}
	o.Run(start, func(n int64, status int, err error, acked time.Time) {
		mu.Lock()
		defer mu.Unlock()
		sentN++
		if err != nil {
			failed++
		} else if statuses[status]++; status == http.StatusAccepted {
			acks = append(acks, ack{seq: n, at: acked})
		}
	})
	sent := time.Since(start)
	busy1, total1 := benchkit.MachineCPU()
	// serve's work is done once the last batch is answered; its CPU over
	// the run is what ingest cost. PostgreSQL's is read before serve's
	// backends go, and again at the end.
	pgAtIngest, err := benchkit.BackendCPU(ctx, pool)
	if err != nil {
		return err
	}
	serveCPU, serveStopped = serve.Stop(), true

	var lastAck time.Time
	for _, a := range acks {
		if a.at.After(lastAck) {
			lastAck = a.at
		}
	}
	for {
		var pending bool
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM usage_logs WHERE billing_status = 'pending')").Scan(&pending); err != nil {
			return err
		}
		if !pending {
			break
		}
		if time.Since(lastAck) > 5*time.Minute {
			return errors.New("logs still pending 5 minutes after the last batch was acknowledged")
		}
		time.Sleep(100 * time.Millisecond)
	}
	pgAtEnd, err := benchkit.BackendCPU(ctx, pool)
	if err != nil {
		return err
	}
	workCPU := work.Stop()
	calls := benchkit.CountCalls(emu.Requests())

	f, err := lags(ctx, pool, acks)
	if err != nil {
		return err
	}
	events := len(acks) * p.batch
	billingSpan := f.LastBilled.Sub(start).Seconds()
	out := map[string]any{
		"tenants": p.tenants, "batch": p.batch, "offered_events_per_s": p.rate, "seconds_offered": p.duration.Seconds(),
		"events_acked": events, "batches_not_acked": sentN - int64(len(acks)), "batches_unanswered": failed, "statuses": statuses,
		"ingested_events_per_s": float64(events) / lastAck.Sub(start).Seconds(),
		"logs":                  f.Logs, "billed": f.Billed, "not_billed": f.Logs - f.Billed,
		"billed_events_per_s":     float64(f.Billed) / billingSpan,
		"billed_after_last_ack_s": f.LastBilled.Sub(lastAck).Seconds(),
		"meter_event_calls":       calls.Total, "calls_refused_429": calls.Refused429, "calls_peak_per_s": calls.PeakPerSecond,
		"calls_mean_per_s":        float64(calls.Total) / max(calls.Last.Sub(calls.First).Seconds(), 1),
		"lag_ack_to_billed_p50_s": f.AckP50, "lag_ack_to_billed_p99_s": f.AckP99, "lag_ack_to_billed_max_s": f.AckMax,
		"lag_created_to_billed_p50_s": f.CreatedP50, "lag_created_to_billed_p99_s": f.CreatedP99,
		"reports": f.Reports, "emulator_latency_ms": p.latency.Milliseconds(),
		"cpu_serve_s": serveCPU.Seconds(), "cpu_work_s": workCPU.Seconds(),
		"cpu_postgres_while_ingesting_s": benchkit.SumCPU(pgAtIngest).Seconds(), "cpu_postgres_s": benchkit.SumCPU(pgAtIngest, pgAtEnd).Seconds(),
		"machine_busy_while_offering": ratio(busy1-busy0, total1-total0), "seconds_sending": sent.Seconds(),
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		return err
	}
	// A batch answered 503 may still have committed (its answer is stored
	// for the client's retry), so there may be more logs than acknowledged
	// events, never fewer.
	if f.Logs != f.Billed || f.Logs < int64(events) {
		return fmt.Errorf("%d events acknowledged, %d usage logs, %d billed: not everything acknowledged was billed", events, f.Logs, f.Billed)
	}
	return nil
}

func ratio(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

type figures struct {
	Logs, Billed, Reports                          int64
	AckP50, AckP99, AckMax, CreatedP50, CreatedP99 float64
	LastBilled                                     time.Time
}

// lags joins each usage log to its batch's acknowledgement through the
// batch number its request_id starts with.
func lags(ctx context.Context, pool *pgxpool.Pool, acks []ack) (figures, error) {
	var f figures
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "CREATE TEMP TABLE e2e_acks (seq bigint PRIMARY KEY, acked_at timestamptz NOT NULL) ON COMMIT DROP"); err != nil {
			return err
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"e2e_acks"}, []string{"seq", "acked_at"},
			pgx.CopyFromSlice(len(acks), func(i int) ([]any, error) { return []any{acks[i].seq, acks[i].at}, nil })); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `
			WITH l AS (
				SELECT u.billing_status, u.billed_at, extract(epoch FROM u.billed_at - a.acked_at) AS ack_lag,
				       extract(epoch FROM u.billed_at - u.created_at) AS created_lag
				FROM usage_logs u LEFT JOIN e2e_acks a ON a.seq = split_part(u.request_id, '.', 1)::bigint)
			SELECT count(*), count(*) FILTER (WHERE billing_status = 'billed'), (SELECT count(*) FROM usage_reports),
			       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY ack_lag), 0), coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY ack_lag), 0),
			       coalesce(max(ack_lag), 0),
			       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY created_lag), 0), coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY created_lag), 0),
			       coalesce(max(billed_at), now())
			FROM l`).Scan(&f.Logs, &f.Billed, &f.Reports, &f.AckP50, &f.AckP99, &f.AckMax, &f.CreatedP50, &f.CreatedP99, &f.LastBilled)
	})
	return f, err
}
