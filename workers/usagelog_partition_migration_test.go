package workers_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage/client"
	"github.com/overage-billing/overage/internal/testkit/apitest"
	"github.com/overage-billing/overage/internal/testkit/billingtest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/usagelog"
	"github.com/overage-billing/overage/workers"
)

// oneAttempt is the Go client of the tenant apiKey making one attempt a
// request: a load measuring failures must see each, not its retry.
func oneAttempt(t *testing.T, url, apiKey string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{BaseURL: url, APIKey: apiKey, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// recordEvent records one single event under request_id rid and key.
func recordEvent(c *client.Client, key, rid string) (*client.Result, error) {
	return c.Record(context.Background(), client.UsageEvent{RequestID: rid, UserID: "u", ModelID: "m", InputTokens: 7, OutputTokens: 3},
		&client.RecordOpts{IdempotencyKey: key})
}

// partitionMoveRows is how many usage logs the move test seeds before the
// move: OVERAGE_PARTITION_MOVE_ROWS (20000000 for the volume;
// bench/partition_move.sh does that with serve and work as processes).
func partitionMoveRows(t *testing.T) int {
	t.Helper()
	if s := os.Getenv("OVERAGE_PARTITION_MOVE_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("OVERAGE_PARTITION_MOVE_ROWS=%q: %v", s, err)
		}
		return n
	}
	return 200_000
}

// moveLoad posts single usage events through the HTTP API from clients
// goroutines until stopped, each under its own request_id and key, and
// keeps what each answer said.
type moveLoad struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	ids  map[string]uuid.UUID // request_id → the log of its answer
	fail []string
	// slowest is the longest a request took; slowestAt when it started.
	slowest   time.Duration
	slowestAt time.Time
}

func startMoveLoad(t *testing.T, url, apiKey string, clients int) *moveLoad {
	l := &moveLoad{stop: make(chan struct{}), ids: map[string]uuid.UUID{}}
	c := oneAttempt(t, url, apiKey)
	post := func(rid string) (uuid.UUID, error) {
		res, err := recordEvent(c, "k-"+rid, rid)
		if err != nil {
			return uuid.Nil, err
		}
		if res.Duplicate || res.Replayed {
			return uuid.Nil, fmt.Errorf("%s answered as an earlier log's (%s)", rid, res.Log.ID)
		}
		return uuid.Parse(res.Log.ID)
	}
	for c := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				rid := fmt.Sprintf("move-%d-%d", c, i)
				t0 := time.Now()
				id, err := post(rid)
				took := time.Since(t0)
				l.mu.Lock()
				if err != nil {
					l.fail = append(l.fail, fmt.Sprintf("%s at %v: %v", rid, t0.Format(time.RFC3339Nano), err))
				} else {
					l.ids[rid] = id
				}
				if took > l.slowest {
					l.slowest, l.slowestAt = took, t0
				}
				l.mu.Unlock()
			}
		}()
	}
	return l
}

func (l *moveLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}

// Migrations 0055-0059 (the bound of 0054 set) move usage_logs and
// usage_reports to partitioned tables on a database of many logs while
// `serve` (the HTTP API) records single events from four clients and
// `work` (real workers, the Stripe emulator) bills them: no request fails
// or waits much longer than the short swaps, every event recorded before,
// during and after the move is one log, read back by its id, billed
// exactly once (what Stripe applied equals what PostgreSQL billed), and
// the counters equal the sums over the logs.
func TestUsageLogsPartitionMoveUnderIngestAndBilling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewEmptyPool(t)
	// 0054 is the first step of the move: the bound and the tables this
	// binary's statements read. The binary that runs during the move in
	// production is the release before; this one works from 0054 on.
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 54); err != nil {
		t.Fatal(err)
	}
	rows := partitionMoveRows(t)
	seeded := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id) VALUES ($1, 'seeded', 'cus_seeded')`, seeded); err != nil {
		t.Fatal(err)
	}
	// Last month's logs, billed: UUIDv7 ids of when they were recorded.
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status, billed_at, created_at, updated_at)
		SELECT (lpad(to_hex(floor(extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7' || lpad(to_hex(g % 4096), 3, '0') || '8'
				|| lpad(to_hex(g), 15, '0'))::uuid,
			$1, 'seed-' || g, t, 'u', 'm', 100, 20, date_trunc('month', t, 'UTC'), 100, 20, 'billed', t, t, t
		FROM (SELECT g, now() - interval '20 days' + g * interval '1 millisecond' AS t FROM generate_series(1, $2::int) g) AS s`,
		seeded, rows); err != nil {
		t.Fatal(err)
	}

	emu := emulator.New(emulator.Options{Seed: 5})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	sc, err := stripeclient.New(stripeclient.Config{SecretKey: "sk_test_123", APIBase: base, RateLimit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	alice, err := tenants.NewStore(pool).Create(ctx, tenants.CreateParams{Name: "alice", StripeCustomerID: "cus_alice"})
	if err != nil {
		t.Fatal(err)
	}
	wk, err := workers.New(pool, workers.Config{Stripe: sc, SweepInterval: 500 * time.Millisecond, SweepGrace: time.Millisecond,
		BatchDelay: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- wk.Run(wctx) }()
	t.Cleanup(func() { cancel(); <-done })
	srv := apitest.StartWith(t, pool, "", apitest.Options{})

	load := startMoveLoad(t, srv.URL, alice.APIKey, 4)
	polltest.Until(t, "ingest before the move", 60*time.Second, func() bool { return load.count() >= 200 })
	before := load.count()
	t0 := time.Now()
	res, err := migrations.Migrate(ctx, pool, nil)
	if err != nil {
		t.Fatalf("migrate under ingest: %v", err)
	}
	created, err := usagelog.EnsurePartitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	during := load.count() - before
	polltest.Until(t, "ingest after the move", 60*time.Second, func() bool { return load.count() >= before+during+200 })
	close(load.stop)
	load.wg.Wait()
	// Later migrations (0060 on) may follow the move's.
	// The months ahead exist after the move, made by this call or by the
	// running work's own partition maintenance, whichever came first.
	parts, err := usagelog.Partitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	ahead := time.Now().UTC().AddDate(0, usagelog.Ahead, 0)
	if len(res.Applied) < 5 || res.Applied[0].Version != 55 || res.Applied[4].Version != 59 ||
		len(parts) < 2 || parts[len(parts)-1].Upper.Before(ahead) {
		t.Fatalf("applied %v, partitions %+v (made by this call %v); want 0055-0059 and the months ahead", res.Applied, parts, created)
	}
	t.Logf("%d logs seeded; the move took %v; %d events recorded, %d during the move; slowest request %v (at %v)",
		rows, took, len(load.ids), during, load.slowest, load.slowestAt.Format(time.RFC3339Nano))
	if len(load.fail) > 0 {
		t.Fatalf("%d requests failed across the move, the first: %s", len(load.fail), load.fail[0])
	}
	// The swaps wait for transactions in flight (at most lockTimeout) and
	// hold their locks for milliseconds; anything near 10 s means a lock
	// was held over a scan.
	if load.slowest > 8*time.Second {
		t.Errorf("a request took %v across the move", load.slowest)
	}
	if during == 0 {
		t.Errorf("no event was recorded while the move ran (%v): the test shows nothing of a live move", took)
	}

	// Every event is one log, read by its id (the partitioned table's
	// primary key), of the request_id it was sent with.
	var ids []uuid.UUID
	var rids []string
	for rid, id := range load.ids {
		ids, rids = append(ids, id), append(rids, rid)
	}
	var found, total int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE EXISTS (SELECT FROM usage_logs u WHERE u.id = k.id AND u.request_id = k.rid)),
			(SELECT count(*) FROM usage_logs WHERE tenant_id = $3)
		FROM unnest($1::uuid[], $2::text[]) AS k (id, rid)`, ids, rids, alice.ID).Scan(&found, &total); err != nil {
		t.Fatal(err)
	}
	if found != len(ids) || total != len(ids) {
		t.Fatalf("%d events answered: %d found by id, %d logs of the tenant; want one each", len(ids), found, total)
	}
	// Billed exactly once each.
	polltest.Until(t, "every log billed", 120*time.Second, func() bool {
		var pending int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE tenant_id = $1 AND billing_status <> 'billed'`, alice.ID).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0
	})
	billed, err := billingtest.Billed(ctx, pool, billingtest.InputEvent, billingtest.OutputEvent, alice.ID.String())
	if err != nil {
		t.Fatal(err)
	}
	if d := billingtest.Disagreement(emu, billed); d != "" {
		t.Fatalf("Stripe and PostgreSQL disagree: %s", d)
	}
	if got := billed[emulator.AppliedKey{Customer: "cus_alice", EventName: billingtest.InputEvent}]; got != 7*int64(len(ids)) {
		t.Errorf("input billed %d, want %d", got, 7*len(ids))
	}
	differ, groups := billingtest.CountersAgainstLines(t, pool)
	if len(differ) != 0 || groups < 2 {
		t.Errorf("%d of %d period_counters groups differ from the logs: %v", len(differ), groups, differ)
	}
	var logs, seededLogs int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT sum(usage_logs) FROM billing_counters WHERE billing_status = 'billed')::bigint,
			(SELECT count(*) FROM usage_logs WHERE tenant_id = $1)`, seeded).Scan(&logs, &seededLogs); err != nil {
		t.Fatal(err)
	}
	if logs != int64(rows+len(ids)) || seededLogs != int64(rows) {
		t.Errorf("billing_counters count %d billed logs, %d seeded logs left; want %d and %d", logs, seededLogs, rows+len(ids), rows)
	}
}
