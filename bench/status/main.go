// Command status measures the finance statement at scale: it seeds usage logs
// across tenants with COPY, then times GET /v1/billing/status through the
// real finance handler and router over loopback HTTP. It prints one JSON
// line: seeding time, the time to rebuild the counters (which is also what
// a GROUP BY over usage_logs costs, the design the counters replace), and
// p50/p99 of the endpoint, for all tenants and for one.
//
// The database must be migrated and hold no usage logs (-create makes and
// migrates it). Seeding disables the counter trigger of inserts during COPY
// and rebuilds the counters afterwards with finance.RebuildCounters, so
// nothing else may write to that database meanwhile.
//
//	go run ./bench/status -database-url 'postgres://postgres@127.0.0.1:5432/overage_status_bench?sslmode=disable' -create
//	go run ./bench/status -database-url ... -create -logs 1000000   # a quick run
//	go run ./bench/status -database-url ... -reuse                  # measure again, no seeding
package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/api"
	"github.com/overage-billing/overage/finance"
	"github.com/overage-billing/overage/migrations"
)

type options struct {
	dbURL       string
	create      bool
	reuse       bool
	logs        int
	tenants     int
	requests    int
	batch       int
	copyWorkers int
	days        int
}

func main() {
	var o options
	flag.StringVar(&o.dbURL, "database-url", os.Getenv("DATABASE_URL"), "benchmark database: migrated and without usage logs (see -create)")
	flag.BoolVar(&o.create, "create", false, "create the database of -database-url if it does not exist, and migrate it")
	flag.BoolVar(&o.reuse, "reuse", false, "measure the logs already seeded instead of seeding")
	flag.IntVar(&o.logs, "logs", 10_000_000, "usage logs to seed")
	flag.IntVar(&o.tenants, "tenants", 1000, "tenants the logs spread over")
	flag.IntVar(&o.requests, "requests", 200, "timed requests per measured query")
	flag.IntVar(&o.batch, "batch", 250_000, "usage logs per COPY")
	flag.IntVar(&o.copyWorkers, "copy-workers", 2, "concurrent COPY connections")
	flag.IntVar(&o.days, "days", 30, "the logs' created_at spreads over this many days up to now")
	flag.Parse()
	if err := run(context.Background(), o); err != nil {
		log.Fatal(err)
	}
}

type result struct {
	Logs              int64   `json:"logs"`
	Tenants           int     `json:"tenants"`
	Seeded            bool    `json:"seeded"`
	CopySeconds       float64 `json:"copy_seconds,omitempty"`
	CopyRowsPerSecond float64 `json:"copy_rows_per_s,omitempty"`
	CopyBatchRows     int     `json:"copy_batch_rows,omitempty"`
	CopyBatchP50ms    float64 `json:"copy_batch_p50_ms,omitempty"`
	CopyBatchP99ms    float64 `json:"copy_batch_p99_ms,omitempty"`
	// The rebuild scans and groups every usage log: what answering from a
	// GROUP BY would cost per request without the counters.
	RebuildCountersMs float64 `json:"rebuild_counters_ms"`
	VacuumAnalyzeMs   float64 `json:"vacuum_analyze_ms"`
	TableMB           int64   `json:"usage_logs_total_mb"`
	Requests          int     `json:"requests"`
	StatusColdMs      float64 `json:"status_first_request_ms"`
	StatusP50ms       float64 `json:"status_p50_ms"`
	StatusP99ms       float64 `json:"status_p99_ms"`
	StatusMaxMs       float64 `json:"status_max_ms"`
	StatusBytes       int     `json:"status_response_bytes"`
	TenantP50ms       float64 `json:"tenant_status_p50_ms"`
	TenantP99ms       float64 `json:"tenant_status_p99_ms"`
	TotalsUsageLogs   int64   `json:"totals_usage_logs"`
	TotalsPending     int64   `json:"totals_pending"`
}

func run(ctx context.Context, o options) error {
	if o.dbURL == "" {
		return errors.New("-database-url (or DATABASE_URL) is required")
	}
	if o.create {
		if err := createDatabase(ctx, o.dbURL); err != nil {
			return err
		}
	}
	cfg, err := pgxpool.ParseConfig(o.dbURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(max(4, o.copyWorkers+2))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if o.create {
		if _, err := migrations.Migrate(ctx, pool, nil); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}

	res := result{Tenants: o.tenants, Requests: o.requests}
	var existing int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM usage_logs").Scan(&existing); err != nil {
		return fmt.Errorf("is the database migrated? %w", err)
	}
	switch {
	case o.reuse && existing == 0:
		return errors.New("-reuse: the database holds no usage logs")
	case !o.reuse && existing > 0:
		return fmt.Errorf("the database already holds %d usage logs: use -reuse, or an empty database", existing)
	}
	if !o.reuse {
		if err := seed(ctx, pool, o, &res); err != nil {
			return fmt.Errorf("seed: %w", err)
		}
		res.Seeded = true
	}

	start := time.Now()
	if err := finance.RebuildCounters(ctx, pool); err != nil {
		return err
	}
	res.RebuildCountersMs = ms(time.Since(start))
	start = time.Now()
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) usage_logs, billing_counters, tenants"); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	res.VacuumAnalyzeMs = ms(time.Since(start))
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM usage_logs),
		(SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('usage_logs'))::bigint / 1000000`).Scan(&res.Logs, &res.TableMB); err != nil {
		return err
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM tenants").Scan(&res.Tenants); err != nil {
		return err
	}
	if err := measure(ctx, pool, o, &res); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// measure serves the finance handler through the real router on a
// loopback port and times requests to it over HTTP.
func measure(ctx context.Context, pool *pgxpool.Pool, o options, res *result) error {
	token := randomToken()
	h := finance.NewHandler(finance.HandlerConfig{DB: pool, AdminToken: token})
	srv := httptest.NewServer(api.NewRouter(api.Config{DB: pool, Handlers: []api.Mounter{h}}))
	defer srv.Close()
	client := srv.Client()

	getReport := func(query string) (time.Duration, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/billing/status"+query, nil)
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		d := time.Since(start)
		if err != nil {
			return 0, nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return 0, nil, fmt.Errorf("GET /v1/billing/status%s: %d %s", query, resp.StatusCode, body)
		}
		return d, body, nil
	}

	cold, body, err := getReport("")
	if err != nil {
		return err
	}
	res.StatusColdMs = ms(cold)
	res.StatusBytes = len(body)
	var rep finance.Statement
	if err := json.Unmarshal(body, &rep); err != nil {
		return err
	}
	// The answer must be right, not only fast: the totals cover every
	// tenant, the tenants come a page at a time (next_cursor), and the
	// pages together list each tenant once.
	listed := map[uuid.UUID]bool{}
	for pg := &rep; ; {
		for _, t := range pg.Tenants {
			if listed[t.TenantID] {
				return fmt.Errorf("tenant %s listed on two pages", t.TenantID)
			}
			listed[t.TenantID] = true
		}
		if pg.NextCursor == nil {
			break
		}
		_, next, err := getReport("?cursor=" + url.QueryEscape(*pg.NextCursor))
		if err != nil {
			return err
		}
		pg = &finance.Statement{}
		if err := json.Unmarshal(next, pg); err != nil {
			return err
		}
	}
	if rep.Totals.UsageLogs != res.Logs || len(listed) != res.Tenants {
		return fmt.Errorf("report says %d logs over %d tenants, the database holds %d over %d",
			rep.Totals.UsageLogs, len(listed), res.Logs, res.Tenants)
	}
	res.TotalsUsageLogs, res.TotalsPending = rep.Totals.UsageLogs, rep.Totals.Pending

	times := make([]time.Duration, 0, o.requests)
	for range o.requests {
		d, _, err := getReport("")
		if err != nil {
			return err
		}
		times = append(times, d)
	}
	res.StatusP50ms, res.StatusP99ms, res.StatusMaxMs = pct(times, 50), pct(times, 99), pct(times, 100)

	// One tenant: the one with the most pending logs.
	var tenant uuid.UUID
	var most int64 = -1
	for _, t := range rep.Tenants {
		if t.Pending > most {
			tenant, most = t.TenantID, t.Pending
		}
	}
	times = times[:0]
	for range o.requests {
		d, _, err := getReport("?tenant_id=" + tenant.String())
		if err != nil {
			return err
		}
		times = append(times, d)
	}
	res.TenantP50ms, res.TenantP99ms = pct(times, 50), pct(times, 99)
	return nil
}

// seed inserts the tenants, then the usage logs with COPY, the counter
// trigger of inserts disabled (it would run once per row); the caller
// rebuilds the counters.
func seed(ctx context.Context, pool *pgxpool.Pool, o options, res *result) error {
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id)
		SELECT gen_random_uuid(), format('bench-tenant-%s', lpad(n::text, 5, '0')), format('cus_bench%s', n)
		FROM generate_series(1, $1) n`, o.tenants); err != nil {
		return err
	}
	rows, err := pool.Query(ctx, "SELECT id FROM tenants ORDER BY name")
	if err != nil {
		return err
	}
	tenants, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return err
	}

	if _, err := pool.Exec(ctx, "ALTER TABLE usage_logs DISABLE TRIGGER usage_logs_billing_counters_insert"); err != nil {
		return err
	}
	defer func() {
		if _, err := pool.Exec(context.WithoutCancel(ctx), "ALTER TABLE usage_logs ENABLE TRIGGER usage_logs_billing_counters_insert"); err != nil {
			log.Printf("re-enable the counter trigger: %v; run: ALTER TABLE usage_logs ENABLE TRIGGER usage_logs_billing_counters_insert", err)
		}
	}()

	batches := make(chan int)
	var mu sync.Mutex
	var batchTimes []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	now := time.Now().UTC()
	span := time.Duration(o.days) * 24 * time.Hour
	start := time.Now()
	for range max(1, o.copyWorkers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				t0 := time.Now()
				err := copyBatch(ctx, pool, tenants, b, min(o.batch, o.logs-b), o.logs, now, span)
				mu.Lock()
				batchTimes = append(batchTimes, time.Since(t0))
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	for b := 0; b < o.logs; b += o.batch {
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed {
			break
		}
		batches <- b
	}
	close(batches)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	elapsed := time.Since(start)
	res.CopySeconds = elapsed.Seconds()
	res.CopyRowsPerSecond = float64(o.logs) / elapsed.Seconds()
	res.CopyBatchRows = o.batch
	res.CopyBatchP50ms, res.CopyBatchP99ms = pct(batchTimes, 50), pct(batchTimes, 99)
	return nil
}

var columns = []string{"id", "tenant_id", "ts", "user_id", "model_id", "input_tokens", "output_tokens", "period_start",
	"overage_input_tokens", "overage_output_tokens", "billing_status", "input_accepted_at", "output_accepted_at",
	"first_attempt_at", "billed_at", "billing_message", "created_at", "updated_at"}

// copyBatch writes logs [first, first+n) of total. Log i was created at
// now - span + i*span/total, so ids (UUIDv7) and created_at both follow
// insertion order, as ingest makes them. The status mix: 90% billed, 5%
// not billable, 3% pending, 1% needs review, 1% failed, tenants uniform.
func copyBatch(ctx context.Context, pool *pgxpool.Pool, tenants []uuid.UUID, first, n, total int, now time.Time, span time.Duration) error {
	rng := mrand.New(mrand.NewPCG(uint64(first), 42))
	i := first
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i >= first+n {
			return nil, nil
		}
		created := now.Add(-span + time.Duration(float64(span)*float64(i)/float64(total)))
		i++
		id := uuidV7At(created, rng)
		in, out := rng.Int64N(4000)+1, rng.Int64N(1500)
		oin, oout := in, out
		var status string
		var inAt, outAt, firstAt, billedAt *time.Time
		var msg *string
		attempt := created.Add(2 * time.Second)
		switch p := rng.IntN(100); {
		case p < 90:
			status = "billed"
			inAt, firstAt, billedAt = &attempt, &attempt, &attempt
			if oout > 0 {
				outAt = &attempt
			}
		case p < 95:
			status, oin, oout = "not_billable", 0, 0
		case p < 98:
			status = "pending"
		case p < 99:
			status = "needs_review"
			firstAt = &attempt
			m := "first sent to Stripe longer ago than Stripe's idempotency window allows for a safe resend; an operator must decide"
			msg = &m
		default:
			status = "failed"
			firstAt = &attempt
			m := "Stripe refused the input meter event: No such customer"
			msg = &m
		}
		period := time.Date(created.Year(), created.Month(), 1, 0, 0, 0, 0, time.UTC)
		return []any{id, tenants[rng.IntN(len(tenants))], created.Add(-time.Second), "u" + fmt.Sprint(i%5000), "gpt-4o", in, out, period,
			oin, oout, status, inAt, outAt, firstAt, billedAt, msg, created, created}, nil
	})
	_, err := pool.CopyFrom(ctx, pgx.Identifier{"usage_logs"}, columns, src)
	return err
}

// uuidV7At is a UUIDv7 with the given time, like the ids ingest makes.
func uuidV7At(t time.Time, rng *mrand.Rand) uuid.UUID {
	var u uuid.UUID
	binary.BigEndian.PutUint64(u[0:8], uint64(t.UnixMilli())<<16|rng.Uint64()&0xffff)
	binary.BigEndian.PutUint64(u[8:16], rng.Uint64())
	u[6] = 0x70 | (u[6] & 0x0f) // version 7
	u[8] = 0x80 | (u[8] & 0x3f) // RFC 4122 variant
	return u
}

// createDatabase creates the database named in dbURL, on its server, when
// it does not exist.
func createDatabase(ctx context.Context, dbURL string) error {
	u, err := url.Parse(dbURL)
	if err != nil {
		return err
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" {
		return errors.New("-create: the URL names no database")
	}
	admin := *u
	admin.Path = "/postgres"
	conn, err := pgx.Connect(ctx, admin.String())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	return err
}

func pct(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return ms(s[max(0, min(len(s)-1, i-1))])
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
