// Command partitionmove measures the move of usage_logs and usage_reports
// to partitioned tables (migrations 0054-0059) on a database of many logs
// while the release before it runs: `overage serve` (the previous binary)
// records single events from clients under request_ids, `overage work`
// (the previous binary) bills them to the Stripe emulator, and `overage
// migrate` of this binary moves the tables. It prints one JSON line: the
// logs seeded, how long the move took, the longest a request waited
// (the ingest stall) and its p99 around the move, the errors, and whether
// every event answered is one log, billed exactly once.
//
// bench/partition_move.sh builds both binaries and runs it on a fresh
// database.
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
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/bench/internal/benchkit"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

func main() {
	dbURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "a database migrated by -old-bin (to 0053) holding bench/setup.sql's tenants")
	oldBin := flag.String("old-bin", "./bin/overage-old", "the release before the move: serve and work")
	bin := flag.String("bin", "./bin/overage", "this release: its migrate moves the tables")
	addr := flag.String("addr", "127.0.0.1:18083", "where serve listens")
	logs := flag.Int("logs", 20_000_000, "usage logs to seed before the move (billed, last month's)")
	clients := flag.Int("clients", 8, "clients sending single events")
	around := flag.Duration("around", 10*time.Second, "how long the load runs before and after the move")
	flag.Parse()
	if err := run(*dbURL, *oldBin, *bin, *addr, *logs, *clients, *around); err != nil {
		log.Fatal(err)
	}
}

// sample is one request: when it was sent, how long its answer took, and
// the request_id of an event answered 202.
type sample struct {
	at   time.Time
	took time.Duration
	rid  string
	err  error
}

func run(dbURL, oldBin, bin, addr string, logs, clients int, around time.Duration) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	seedStart := time.Now()
	// Last month's billed logs of the 100 benchmark tenants, with UUIDv7
	// ids of when they were recorded, a million a statement, and a report
	// of one in 25.
	for done := 0; done < logs; done += 1_000_000 {
		n := min(1_000_000, logs-done)
		if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
				period_start, overage_input_tokens, overage_output_tokens, billing_status, billed_at, created_at, updated_at)
			SELECT (lpad(to_hex(floor(extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7' || lpad(to_hex(g % 4096), 3, '0') || '8'
					|| lpad(to_hex(g), 15, '0'))::uuid,
				('00000000-0000-0000-0000-' || lpad((g % 100 + 1)::text, 12, '0'))::uuid, 'seed-' || g, t, 'u', 'm', 100, 20,
				date_trunc('month', t, 'UTC'), 100, 20, 'billed', t, t, t
			FROM (SELECT g, now() - interval '30 days' + g * interval '100 microseconds' AS t
				FROM generate_series($1::bigint, $2::bigint) g) AS s`, done+1, done+n); err != nil {
			return fmt.Errorf("seed logs: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_reports (lead_usage_log_id, dimension, tenant_id, period_start, usage_day, value, ts,
			member_ids, state, first_attempt_at, accepted_at)
		SELECT id, 'input', tenant_id, period_start, ts::date, 100, ts, ARRAY[id], 'accepted', ts, ts
		FROM usage_logs WHERE request_id ~ '^seed-[0-9]*(00|32|64|96)$'`); err != nil {
		return fmt.Errorf("seed reports: %w", err)
	}
	// What autovacuum would long have done to a month of logs.
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE usage_logs, usage_reports`); err != nil {
		return fmt.Errorf("vacuum the seeded tables: %w", err)
	}
	seeded := time.Since(seedStart)

	emu := emulator.New(emulator.Options{Faults: emulator.Faults{Latency: 5 * time.Millisecond}})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer emu.Close()
	serve, err := benchkit.StartServe(oldBin, dbURL, addr)
	if err != nil {
		return err
	}
	defer serve.Stop()
	work, err := benchkit.StartWork(benchkit.WorkOpts{Bin: oldBin, DatabaseURL: dbURL, StripeBase: base, RateLimit: 1000, Workers: 50})
	if err != nil {
		return err
	}
	defer work.Stop()

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}, Timeout: 60 * time.Second}
	stop := make(chan struct{})
	var mu sync.Mutex
	var samples []sample
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				rid := fmt.Sprintf("move-%d-%d", c, i)
				body := fmt.Sprintf(`{"request_id":%q,"user_id":"u","model_id":"m","input_tokens":7,"output_tokens":3}`, rid)
				t0 := time.Now()
				status, err := benchkit.Post(hc, "http://"+addr+"/v1/usage-events", benchkit.BenchKey(c%100+1), "k-"+rid, body)
				if err == nil && status != http.StatusAccepted {
					err = fmt.Errorf("status %d", status)
				}
				mu.Lock()
				samples = append(samples, sample{at: t0, took: time.Since(t0), rid: rid, err: err})
				mu.Unlock()
			}
		}()
	}
	time.Sleep(around) // the load before the move
	moveStart := time.Now()
	out, err := exec.Command(bin, "migrate", "--database-url", dbURL).CombinedOutput()
	moved := time.Since(moveStart)
	if err != nil {
		close(stop)
		wg.Wait()
		return fmt.Errorf("migrate: %w\n%s", err, out)
	}
	time.Sleep(around) // and after
	close(stop)
	wg.Wait()

	// Every event answered 202 is one log, billed once.
	var rids []string
	var errs []string
	var worst sample
	var during []time.Duration
	for _, s := range samples {
		if s.err != nil {
			errs = append(errs, fmt.Sprintf("%s at %s: %v", s.rid, s.at.Format(time.RFC3339Nano), s.err))
			continue
		}
		rids = append(rids, s.rid)
		if s.took > worst.took {
			worst = s
		}
		if s.at.Add(s.took).After(moveStart) && s.at.Before(moveStart.Add(moved)) {
			during = append(during, s.took)
		}
	}
	waitStart := time.Now()
	var logsOf, billed, dup int
	for {
		if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE billing_status = 'billed'),
				count(*) - count(DISTINCT request_id)
			FROM usage_logs WHERE request_id = ANY($1)`, rids).Scan(&logsOf, &billed, &dup); err != nil {
			return err
		}
		if billed == len(rids) || time.Since(waitStart) > 5*time.Minute {
			break
		}
		time.Sleep(time.Second)
	}
	applied := emu.Applied()
	var appliedIn int64
	for k, v := range applied {
		if k.EventName == overage.DefaultMeterInputEvent {
			appliedIn += v
		}
	}
	var billedIn int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(coalesce(overage_input_tokens, input_tokens)), 0)::bigint FROM usage_logs
		WHERE request_id = ANY($1) AND billing_status = 'billed'`, rids).Scan(&billedIn); err != nil {
		return err
	}
	var kind string
	if err := pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'usage_logs'::regclass`).Scan(&kind); err != nil {
		return err
	}
	sort.Slice(during, func(i, j int) bool { return during[i] < during[j] })
	res := map[string]any{
		"logs_seeded": logs, "seed_s": seeded.Seconds(), "move_s": moved.Seconds(), "partitioned": kind == "p",
		"events": len(rids), "events_during_move": len(during), "errors": len(errs),
		"longest_request_ms": float64(worst.took.Microseconds()) / 1000, "longest_request_at_s": worst.at.Sub(moveStart).Seconds(),
		"p99_during_move_ms": benchkit.Percentile(during, 0.99),
		"logs_of_events":     logsOf, "billed": billed, "duplicate_logs": dup,
		"billed_input_tokens": billedIn, "stripe_applied_input_tokens": appliedIn,
		"migrate_output": strings.Split(strings.TrimSpace(string(out)), "\n"),
	}
	if len(errs) > 0 {
		res["first_error"] = errs[0]
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return err
	}
	if len(errs) > 0 || logsOf != len(rids) || billed != len(rids) || dup != 0 || billedIn != appliedIn {
		return errors.New("the move lost, doubled or failed events (see above)")
	}
	return nil
}
