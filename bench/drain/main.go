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
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/bench/internal/benchkit"
	"github.com/overage-billing/overage/finance"
	"github.com/overage-billing/overage/meters"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/stripeclient/emulator"

	"github.com/overage-billing/overage/usagelog"
)

func main() {
	dbURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "migrated, empty benchmark database")
	bin := flag.String("bin", "./bin/overage", "the overage binary")
	logs := flag.Int("logs", 200000, "pending usage logs to drain")
	tenants := flag.Int("tenants", 100, "tenants (Stripe customers) the logs spread over")
	latency := flag.Duration("latency", 5*time.Millisecond, "emulator latency per call")
	workers := flag.Int("workers", 200, "REPORT_WORKERS of the work process")
	rateLimit := flag.Int("rate-limit", 1000, "STRIPE_RATE_LIMIT of the work process; the emulator enforces Stripe's 1,000/s per account")
	batchMax := flag.Int("batch-max", 0, "REPORT_BATCH_MAX of the work process (0: its default)")
	flag.IntVar(&meterCount, "meters", 2, "meters each log feeds: 2 (the defaults) or 3 (m_input, m_cache, m_output of a per-model catalog, as bench/meters.lib.sh creates)")
	flag.BoolVar(&noSeed, "no-seed", false, "drain the logs already in the database (ingested by a load beforehand) instead of seeding a backlog")
	hang := flag.Int("hang", 0, "customers whose calls never get an answer; the drain ends when everyone else's logs are billed")
	flag.Parse()
	if err := run(*dbURL, *bin, *logs, *tenants, *latency, *workers, *rateLimit, *batchMax, *hang); err != nil {
		log.Fatal(err)
	}
}

// meterCount is -meters.
var meterCount int

// noSeed is -no-seed.
var noSeed bool

func run(dbURL, bin string, logs, tenants int, latency time.Duration, workers, rateLimit, batchMax, hang int) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if noSeed {
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM usage_logs WHERE "+usagelog.Is("billing_status", overage.BillingStatusPending)).Scan(&logs); err != nil {
			return err
		}
	} else if err := seed(ctx, pool, logs, tenants); err != nil {
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

	start := time.Now()
	work, err := benchkit.StartWork(benchkit.WorkOpts{Bin: bin, DatabaseURL: dbURL, StripeBase: base, RateLimit: rateLimit, Workers: workers, BatchMax: batchMax})
	if err != nil {
		return err
	}
	defer work.Stop()
	for {
		// EXISTS, not count(*): the poll must not itself load the database
		// it measures.
		var pending bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM usage_logs u JOIN tenants t ON t.id = u.tenant_id
			WHERE `+usagelog.Is("u.billing_status", overage.BillingStatusPending)+` AND t.stripe_customer_id <> ALL($1))`, hung).Scan(&pending); err != nil {
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
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM usage_logs WHERE "+usagelog.Is("billing_status", overage.BillingStatusBilled)).Scan(&billed); err != nil {
		return err
	}
	calls := benchkit.CountCalls(emu.Requests())
	var reports int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM usage_reports").Scan(&reports); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"logs": logs, "tenants": tenants, "billed": billed, "reports": reports, "meter_event_calls": calls.Total, "seconds": elapsed.Seconds(),
		"logs_per_s": float64(billed) / elapsed.Seconds(), "calls_per_s": float64(calls.Total) / elapsed.Seconds(), "calls_peak_per_s": calls.PeakPerSecond,
		"calls_refused_429":   calls.Refused429,
		"emulator_latency_ms": latency.Milliseconds(), "meters": meterCount, "report_workers": workers, "hanging_customers": hang, "batch_max": batchMax,
	})
}

// seed writes tenants, pending logs (each with input and output overage,
// two meter events) and their report jobs, as ingest would have.
func seed(ctx context.Context, pool *pgxpool.Pool, logs, tenants int) error {
	switch meterCount {
	case 2:
	case 3:
		store := meters.NewStore(pool, "llm_input_tokens", "llm_output_tokens")
		for _, p := range []meters.CreateParams{
			{Key: "m_input", EventName: "m_input_tokens", TokenType: overage.TokenInput, Models: []string{"gpt-4o"}},
			{Key: "m_cache", EventName: "m_cache_read_tokens", TokenType: overage.TokenCacheRead, Models: []string{"gpt-4o"}},
			{Key: "m_output", EventName: "m_output_tokens", TokenType: overage.TokenOutput, Models: []string{"gpt-4o"}},
		} {
			if _, err := store.Create(ctx, p); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("-meters %d: 2 or 3", meterCount)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id)
		SELECT gen_random_uuid(), 'drain' || n, 'cus_drain' || n FROM generate_series(1, $1) n`, tenants); err != nil {
		return err
	}
	// The backlog is inserted with the counters trigger off, then the
	// counters are rebuilt once from the rows, as finance.RebuildCounters
	// does for an operator's bulk load.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `ALTER TABLE usage_logs DISABLE TRIGGER usage_logs_billing_counters_insert`); err != nil {
			return err
		}
		insert := `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
				period_start, overage_input_tokens, overage_output_tokens, billing_status)
			SELECT (lpad(to_hex(floor(extract(epoch FROM now()) * 1000)::bigint), 12, '0') || '7' || lpad(to_hex(n % 4096), 3, '0') || '8' || lpad(to_hex(n), 15, '0'))::uuid, t.id, now() - interval '1 minute', 'u' || n, 'm', 100, 50, date_trunc('month', now()), 100, 50, 'pending'
			FROM generate_series(1, $1) n
			JOIN (SELECT id, row_number() OVER () - 1 AS i FROM tenants) t ON t.i = n % $2`
		if meterCount == 3 {
			// What ingest records for the benchmark's event of gpt-4o
			// (1,200 input tokens, 800 of them cache reads, 350 output)
			// under the catalog: nothing on the default meters, three
			// meter lines. The meter counters' statement trigger stays on.
			insert = `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens, cache_read_input_tokens,
				period_start, overage_input_tokens, overage_output_tokens, billing_status, meter_keys, meter_tokens, meter_overage)
			SELECT (lpad(to_hex(floor(extract(epoch FROM now()) * 1000)::bigint), 12, '0') || '7' || lpad(to_hex(n % 4096), 3, '0') || '8' || lpad(to_hex(n), 15, '0'))::uuid, t.id, now() - interval '1 minute', 'u' || n, 'gpt-4o', 1200, 350, 800, date_trunc('month', now()), 0, 0, 'pending',
				'{m_input,m_cache,m_output}', '{400,800,350}', '{400,800,350}'
			FROM generate_series(1, $1) n
			JOIN (SELECT id, row_number() OVER () - 1 AS i FROM tenants) t ON t.i = n % $2`
		}
		if _, err := tx.Exec(ctx, insert, logs, tenants); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `ALTER TABLE usage_logs ENABLE TRIGGER usage_logs_billing_counters_insert`)
		return err
	}); err != nil {
		return err
	}
	if err := finance.RebuildCounters(ctx, pool); err != nil {
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
		_, err := outbox.NewInserter(rc, outbox.DefaultMaxAttempts).InsertTenantReportsTx(ctx, tx, rc, ids)
		return err
	})
}
