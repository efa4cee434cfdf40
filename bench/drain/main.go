// Command drain measures how fast one `overage work` process drains a
// backlog of pending usage logs into Stripe: it seeds the backlog, starts
// the local Stripe emulator with added latency, runs the binary as a child
// process and times it until nothing is pending. It prints logs/s and
// meter-event calls/s as one JSON line. With -hang N, the first N customers'
// calls never get an answer, and the drain is timed until every other
// customer's logs are billed: one hanging customer must not stall the rest.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

func main() {
	dbURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "migrated, empty benchmark database")
	bin := flag.String("bin", "./bin/overage", "the overage binary")
	logs := flag.Int("logs", 200000, "pending usage logs to drain")
	tenants := flag.Int("tenants", 100, "tenants (Stripe customers) the logs spread over")
	latency := flag.Duration("latency", 5*time.Millisecond, "emulator latency per call")
	workers := flag.Int("workers", 200, "REPORT_WORKERS of the work process")
	rateLimit := flag.Int("rate-limit", 1000, "STRIPE_RATE_LIMIT of the work process; the emulator enforces Stripe's 1,000/s per account")
	hang := flag.Int("hang", 0, "customers whose calls never get an answer; the drain ends when everyone else's logs are billed")
	flag.Parse()
	if err := run(*dbURL, *bin, *logs, *tenants, *latency, *workers, *rateLimit, *hang); err != nil {
		log.Fatal(err)
	}
}

func run(dbURL, bin string, logs, tenants int, latency time.Duration, workers, rateLimit, hang int) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := seed(ctx, pool, logs, tenants); err != nil {
		return fmt.Errorf("seed: %w", err)
	}

	hung := []string{} // not nil: NULL would make "<> ALL" unknown and end the drain at once
	for n := 1; n <= hang; n++ {
		hung = append(hung, "cus_drain"+strconv.Itoa(n))
	}
	emu := emulator.New(emulator.Options{Faults: emulator.Faults{Latency: latency, BlackholeCustomers: hung}})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer emu.Close()

	cmd := exec.Command(bin, "work")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "STRIPE_SECRET_KEY=sk_test_123", "STRIPE_API_BASE="+base,
		"STRIPE_RATE_LIMIT="+strconv.Itoa(rateLimit), "REPORT_WORKERS="+strconv.Itoa(workers), "LOG_LEVEL=warn")
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()
	for {
		// EXISTS, not count(*): the poll must not itself load the database
		// it measures.
		var pending bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM usage_logs u JOIN tenants t ON t.id = u.tenant_id
			WHERE u.billing_status = 'pending' AND t.stripe_customer_id <> ALL($1))`, hung).Scan(&pending); err != nil {
			return err
		}
		if !pending {
			break
		}
		if time.Since(start) > 15*time.Minute {
			return errors.New("logs still pending after 15 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	elapsed := time.Since(start)
	var billed int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM usage_logs WHERE billing_status = 'billed'").Scan(&billed); err != nil {
		return err
	}
	reqs := emu.Requests()
	calls := len(reqs)
	// Calls per second: the mean over the drain, and the busiest second.
	perSecond := map[int64]int{}
	limited := 0
	for _, r := range reqs {
		perSecond[r.ReceivedAt.Unix()]++
		if r.Outcome == emulator.OutcomeRateLimited || r.Outcome == emulator.OutcomeConcurrentRateLimit {
			limited++
		}
	}
	peak := 0
	for _, n := range perSecond {
		peak = max(peak, n)
	}
	var reports int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM usage_reports").Scan(&reports); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"logs": logs, "tenants": tenants, "billed": billed, "reports": reports, "meter_event_calls": calls, "seconds": elapsed.Seconds(),
		"logs_per_s": float64(billed) / elapsed.Seconds(), "calls_per_s": float64(calls) / elapsed.Seconds(), "calls_peak_per_s": peak,
		"calls_refused_429":   limited,
		"emulator_latency_ms": latency.Milliseconds(), "report_workers": workers, "hanging_customers": hang,
	})
}

// seed writes tenants, pending logs (each with input and output overage,
// two meter events) and their report jobs, as ingest would have.
func seed(ctx context.Context, pool *pgxpool.Pool, logs, tenants int) error {
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id)
		SELECT gen_random_uuid(), 'drain' || n, 'cus_drain' || n FROM generate_series(1, $1) n`, tenants); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status)
		SELECT gen_random_uuid(), t.id, now() - interval '1 minute', 'u' || n, 'm', 100, 50, date_trunc('month', now()), 100, 50, 'pending'
		FROM generate_series(1, $1) n
		JOIN (SELECT id, row_number() OVER () - 1 AS i FROM tenants) t ON t.i = n % $2`, logs, tenants); err != nil {
		return err
	}
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		return err
	}
	// One report job per tenant, as ingest queues them: each forms the
	// tenant's reports of up to REPORT_BATCH_MAX logs.
	rows, err := pool.Query(ctx, "SELECT id FROM tenants")
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.NewInserter(rc, 5).InsertTenantReportsTx(ctx, tx, rc, ids)
		return err
	})
}
