package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/internal/poll"
	"github.com/overage-billing/overage/internal/testkit/billingtest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/syncbuf"
	"github.com/overage-billing/overage/stripeclient/emulator"

	"go.uber.org/goleak"
)

// childEnv makes the test binary act as the overage binary: the chaos test
// runs `overage work` as a real child process it can SIGKILL.
const childEnv = "OVERAGE_TEST_CHILD_ARGS"

// chaosCloseGrace is the chaos run's PERIOD_CLOSE_GRACE (see its env).
const chaosCloseGrace = "96h"

func TestMain(m *testing.M) {
	if args := os.Getenv(childEnv); args != "" {
		main2(strings.Fields(args))
		return
	}
	// Otherwise the tests, failed if a goroutine outlives them.
	// An idle keep-alive connection of an HTTP client (stripe-go's, the
	// tests' own) to a server that is still up at the end is pooled, not
	// leaked: its read and write loops end when either side closes it.
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"))
}

// main2 is main with given arguments.
func main2(args []string) {
	os.Args = append([]string{"overage"}, args...)
	main()
}

// TestChaos ingests events over the real HTTP API, then drains them with
// `overage work` child processes that are SIGKILLed twice mid-drain, against
// an emulator that loses 15% of its answers and fails 10% of requests with
// 500 or 429. Whatever happened, Stripe must hold exactly the overage
// PostgreSQL holds as billed, no identifier may be applied twice, and every
// log must end billed or not billable.
//
// CHAOS_EVENTS sets the size (`make chaos` runs it large; `make test` runs
// it small).
func TestChaos(t *testing.T) {
	t.Parallel()
	events := 300
	if v := os.Getenv("CHAOS_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("CHAOS_EVENTS=%q: %v", v, err)
		}
		events = n
	}

	dbURL := pgtest.NewDatabase(t)
	emu := emulator.New(emulator.Options{Seed: 42, Faults: emulator.Faults{
		LostResponseRate: 0.15, ServerErrorRate: 0.05, RateLimitRate: 0.05, Latency: time.Millisecond,
	}})
	stripeURL, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)

	// Racing checkpoints send a tenant's requests many at a time: past
	// TENANT_MAX_INFLIGHT they would be refused, not raced.
	// The usage spans three UTC days, which may straddle a month's end: a
	// PERIOD_CLOSE_GRACE longer than that keeps every period open, so each
	// log is billed, and reconciled, on its usage day.
	env := map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0", "ADMIN_TOKEN": chaosAdminToken, "TENANT_MAX_INFLIGHT": "1000",
		"PERIOD_CLOSE_GRACE": chaosCloseGrace}
	type tenant struct {
		ID     string `json:"id"`
		APIKey string `json:"api_key"`
	}
	// Cached input on a meter of its own: every report, resend and
	// correction of it must be exactly once too.
	if out, _, err := runCmd(t, env, "meter", "create", "--key", "cache_read", "--event-name", chaosCacheEvent, "--token-type", "cache_read"); err != nil {
		t.Fatalf("meter create: %v\n%s", err, out)
	}
	var tenantList []tenant
	for i, args := range [][]string{
		{"--stripe-customer", "cus_chaos1"},
		{"--stripe-customer", "cus_chaos2"},
		{"--stripe-customer", "cus_chaos3"},
		{"--stripe-customer", "cus_chaos4", "--included-input-tokens", "20000", "--included-output-tokens", "5000"},
	} {
		out, _, err := runCmd(t, env, append([]string{"tenant", "create", "--name", fmt.Sprintf("chaos%d", i)}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var tn tenant
		if err := json.Unmarshal([]byte(out), &tn); err != nil {
			t.Fatal(err)
		}
		tenantList = append(tenantList, tn)
	}

	// Ingest over real HTTP, some requests sent twice (a client retry after
	// a timeout) and some request_ids reused under a new key.
	var cfg app.ServeConfig
	if err := cfg.Read(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	srv, err := app.NewServer(context.Background(), &cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	sctx, stopServer := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Run(sctx) }()
	defer func() { stopServer(); <-served; srv.Close() }()

	var wg sync.WaitGroup
	var sent atomic.Int64
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				tn := tenantList[i%len(tenantList)]
				// Three UTC days of usage: reports never span two.
				ts := time.Now().UTC().Add(-time.Minute - time.Duration(i%3)*24*time.Hour).Format(time.RFC3339)
				// One event in four read part of its prompt from a cache.
				cached := ""
				if i%4 == 0 {
					cached = fmt.Sprintf(`,"cache_read_input_tokens":%d`, 100+i%400)
				}
				body := fmt.Sprintf(`{"request_id":"req-%d","timestamp":"%s","user_id":"u%d","model_id":"gpt-4o","input_tokens":%d,"output_tokens":%d%s}`, i, ts, i%7, 500+i%900, 100+i%300, cached)
				for _, key := range []string{fmt.Sprintf("key-%d", i), fmt.Sprintf("key-%d", i), fmt.Sprintf("other-%d", i)}[:1+i%3] {
					status := postEvent(t, srv.Addr(), tn.APIKey, key, body)
					if status != http.StatusAccepted && status != http.StatusOK {
						t.Errorf("event %d: status %d", i, status)
					}
				}
				sent.Add(1)
			}
		}()
	}
	for i := range events {
		work <- i
	}
	close(work)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// Streamed responses: checkpoints racing (some sent twice, in any
	// order), then for half of the streams a final count lower than the
	// last checkpoint; the other half are abandoned mid-stream.
	streams := max(events/20, 4)
	var swg sync.WaitGroup
	for sn := range streams {
		tn := tenantList[sn%len(tenantList)]
		rid := fmt.Sprintf("stream-%d", sn)
		for seq := range 4 {
			for range 1 + seq%2 {
				swg.Add(1)
				go func() {
					defer swg.Done()
					body := fmt.Sprintf(`{"request_id":%q,"user_id":"u","model_id":"gpt-4o","input_tokens":%d,"output_tokens":%d,"stream":{"sequence":%d}}`,
						rid, 300*(seq+1), 60*(seq+1), seq)
					if status := postEvent(t, srv.Addr(), tn.APIKey, fmt.Sprintf("%s:%d", rid, seq), body); status != http.StatusAccepted && status != http.StatusOK {
						t.Errorf("checkpoint %s:%d: status %d", rid, seq, status)
					}
				}()
			}
		}
	}
	swg.Wait()
	for sn := 0; sn < streams; sn += 2 {
		rid := fmt.Sprintf("stream-%d", sn)
		body := fmt.Sprintf(`{"request_id":%q,"user_id":"u","model_id":"gpt-4o","input_tokens":1000,"output_tokens":250,"stream":{"sequence":4,"final":true}}`, rid)
		if status := postEvent(t, srv.Addr(), tenantList[sn%len(tenantList)].APIKey, rid+":4", body); status != http.StatusAccepted {
			t.Errorf("final checkpoint of %s: status %d", rid, status)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	count := func(q string) int {
		var n int
		if err := pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count("SELECT count(*) FROM usage_logs WHERE stream_request_id IS NULL"); n != events {
		t.Fatalf("%d usage logs for %d events", n, events)
	}
	// Each stream's logs add up to its totals: every increase once.
	if n := count(`SELECT count(*) FROM usage_streams s, LATERAL (SELECT sum(input_tokens) i, sum(output_tokens) o FROM usage_logs u
			WHERE u.tenant_id = s.tenant_id AND u.stream_request_id = s.request_id) l
		WHERE s.input_tokens <> l.i OR s.output_tokens <> l.o OR s.input_tokens <> CASE WHEN s.final THEN 1000 ELSE 1200 END`); n != 0 || count("SELECT count(*) FROM usage_streams") != streams {
		t.Fatalf("%d of %d streams whose logs do not add up to their totals", n, streams)
	}
	// Corrections, over HTTP, of logs not yet sent: some lowered (some of
	// those sent twice under their key, a client retry), some voided.
	correctWave(t, srv.Addr(), pool, events, func(i, in, out int) (int, int, bool) {
		switch i % 10 {
		case 0:
			return in / 2, out, i%20 == 0
		case 5:
			return 0, 0, false
		}
		return 0, 0, false
	}, []int{0, 5})
	billable := count("SELECT count(*) FROM usage_logs WHERE billing_status = 'pending'")

	workerEnv := append(os.Environ(),
		"DATABASE_URL="+dbURL,
		"STRIPE_SECRET_KEY=sk_test_123",
		"STRIPE_API_BASE="+stripeURL,
		"PERIOD_CLOSE_GRACE="+chaosCloseGrace,
		"SWEEP_INTERVAL=1s",
		"SWEEP_GRACE=2s",
		"REPORT_JOB_TIMEOUT=3s",
		"REPORT_MAX_ATTEMPTS=3",
		"REPORT_WORKERS=20",
		// Small reports: many of them, so the kills land among them.
		"REPORT_BATCH_MAX=10",
		"LOG_LEVEL=warn",
	)
	startWorker := func(extraEnv ...string) (*exec.Cmd, *syncbuf.Buffer) {
		cmd := exec.Command(os.Args[0])
		var stderr syncbuf.Buffer
		cmd.Env = append(append(workerEnv, childEnv+"=work"), extraEnv...)
		cmd.Stdout, cmd.Stderr = io.Discard, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, &stderr
	}
	waitBilled := func(atLeast int, timeout time.Duration) {
		polltest.Until(t, fmt.Sprintf("%d logs billed", atLeast), timeout, func() bool {
			return count("SELECT count(*) FROM usage_logs WHERE billing_status = 'billed'") >= atLeast
		})
	}

	// Kill -9 between send and commit: Stripe has applied a report (its
	// answer held back a while) that PostgreSQL still holds open. Its
	// resend after the restart must carry the same key and be replayed.
	faults := emu.Faults()
	slow := faults
	slow.AnswerDelay = 500 * time.Millisecond
	emu.SetFaults(slow)
	cmd, stderr := startWorker()
	var caught string
	if err := poll.Wait(context.Background(), "a report applied at Stripe and open in PostgreSQL", 2*time.Minute, 5*time.Millisecond, func() (bool, error) {
		for _, e := range emu.Events() {
			if count(`SELECT count(*) FROM usage_reports WHERE state = 'open'
				AND 'usage-log:' || lead_usage_log_id || ':' || dimension = '`+e.Identifier+`'`) == 1 {
				caught = e.Identifier
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("%v; worker stderr:\n%s", err, tail(stderr.String(), 20))
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	emu.SetFaults(faults)
	t.Logf("killed the worker between send and commit of %s", caught)

	// And once more halfway through.
	cmd, stderr = startWorker()
	waitBilled(billable/2, 2*time.Minute)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	t.Logf("killed the worker with %d of %d billable logs billed; its stderr:\n%s", count("SELECT count(*) FROM usage_logs WHERE billing_status = 'billed'"), billable, tail(stderr.String(), 5))

	// Corrections of logs that may already be billed, some raising a total.
	correctWave(t, srv.Addr(), pool, events, func(i, in, out int) (int, int, bool) {
		return in + 200, out / 3, i%6 == 3
	}, []int{3})

	cmd, stderr = startWorker("WORK_LISTEN_ADDR=127.0.0.1:0", "LOG_LEVEL=info")
	healthAddr := loggedAddr(t, stderr, "work health and metrics")
	if err := poll.Wait(context.Background(), "no log pending", 4*time.Minute, 100*time.Millisecond, func() (bool, error) {
		return count("SELECT count(*) FROM usage_logs WHERE billing_status = 'pending'") == 0, nil
	}); err != nil {
		t.Fatalf("%v; worker stderr:\n%s", err, tail(stderr.String(), 20))
	}
	// The work process serves its health and metrics, which moved with the
	// reports it made. (A timeout here is reported by the checks below,
	// with the body.)
	metricsBody := ""
	_ = poll.Wait(context.Background(), "work /metrics with no log pending", 5*time.Second, 50*time.Millisecond, func() (bool, error) {
		res, err := httpClient.Get("http://" + healthAddr + "/metrics")
		if err != nil {
			return false, nil
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		metricsBody = string(b)
		return strings.Contains(metricsBody, "overage_pending_usage_logs 0"), nil
	})
	for _, want := range []string{`overage_stripe_calls_total{outcome="accepted"}`, "overage_pending_usage_logs 0", "overage_stripe_call_duration_seconds_count"} {
		if !strings.Contains(metricsBody, want) {
			t.Fatalf("work /metrics lacks %q:\n%s", want, tail(metricsBody, 40))
		}
	}
	if res, err := httpClient.Get("http://" + healthAddr + "/healthz"); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("work /healthz: %v", err)
	}
	if strings.Contains(stderr.String(), "sk_test_123") {
		t.Fatal("the Stripe key reached the work log")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("worker did not stop cleanly on SIGTERM: %v\n%s", err, tail(stderr.String(), 20))
	}

	if n := count("SELECT count(*) FROM usage_logs WHERE billing_status NOT IN ('billed', 'not_billable')"); n != 0 {
		t.Fatalf("%d logs neither billed nor not_billable", n)
	}
	billingtest.RequireStripeMatchesBilled(t, pool, emu)
	want := billingtest.BilledTotals(t, pool)
	cacheBilled := int64(0)
	for k, v := range want {
		if k.EventName == chaosCacheEvent {
			cacheBilled += v
		}
	}
	if cacheBilled == 0 {
		t.Fatalf("nothing billed on the cache-read meter: %v", want)
	}
	var resent bool
	for _, r := range emu.Requests() {
		resent = resent || (r.IdempotencyKey == caught && (r.Outcome == emulator.OutcomeReplayed || r.Outcome == emulator.OutcomeAlreadyExists))
	}
	if !resent || emu.AppliedCount(caught) != 1 {
		t.Fatalf("the report caught between send and commit (%s): resent %v, applied %d times", caught, resent, emu.AppliedCount(caught))
	}
	var reports int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM usage_reports").Scan(&reports); err != nil || reports < 2*len(tenantList) {
		t.Fatalf("%d reports (%v)", reports, err)
	}

	// Reconciliation per customer, meter and UTC day agrees with Stripe.
	// Today's window is still open (too recent to judge): the two days
	// before it are complete.
	from, to := time.Now().UTC().AddDate(0, 0, -2).Format("2006-01-02"), time.Now().UTC().AddDate(0, 0, -1).Format("2006-01-02")
	out, _, err := runCmd(t, map[string]string{"DATABASE_URL": dbURL, "STRIPE_SECRET_KEY": "sk_test_123", "STRIPE_API_BASE": stripeURL},
		"reconcile", "--from", from, "--to", to, "--settle-after", "0s", "--json")
	if err != nil {
		t.Fatalf("reconcile after the chaos run: %v\n%s", err, out)
	}
	var rec struct{ Matches, Differences, TooRecent int }
	days := count(`SELECT coalesce(sum((i <> 0)::int + (o <> 0)::int + (c <> 0)::int), 0) FROM (SELECT sum(coalesce(u.overage_input_tokens, u.input_tokens)) i, sum(coalesce(u.overage_output_tokens, u.output_tokens)) o,
			coalesce(sum((SELECT sum(x) FROM unnest(u.meter_overage) AS x)), 0) c
		FROM usage_logs u WHERE u.billing_status = 'billed' AND (u.ts AT TIME ZONE 'UTC')::date < (now() AT TIME ZONE 'UTC')::date
		GROUP BY u.tenant_id, (u.ts AT TIME ZONE 'UTC')::date) x`)
	if err := json.Unmarshal([]byte(out), &rec); err != nil || rec.Differences != 0 || rec.TooRecent != 0 || rec.Matches != days || days < len(tenantList) {
		t.Fatalf("reconcile after the chaos run: %+v (%v), want %d customer x meter x day matches\n%s", rec, err, days, tail(out, 30))
	}

	// GET /v1/usage agrees with the rows: per meter, this period's tokens,
	// overage and billed overage, from counters.
	for _, tn := range tenantList {
		req, _ := http.NewRequest(http.MethodGet, "http://"+srv.Addr()+"/v1/usage?tenant_id="+tn.ID, nil)
		req.Header.Set("Authorization", "Bearer "+chaosAdminToken)
		req.Close = true // no idle connection outlives the server
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var usage struct {
			Meters []struct {
				Meter                          string
				Used, Overage, Billed, Pending int64
			}
		}
		err = json.NewDecoder(res.Body).Decode(&usage)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/usage: %d %v", res.StatusCode, err)
		}
		want := map[string][3]int64{}
		rows, err := pool.Query(context.Background(), `
			WITH l AS (SELECT * FROM usage_logs WHERE tenant_id = $1 AND period_start = date_trunc('month', now(), 'UTC')),
			x AS (SELECT l.billing_status, k.k, k.t, k.o FROM l, unnest(l.meter_keys, coalesce(l.meter_tokens, l.meter_overage), l.meter_overage) AS k (k, t, o))
			SELECT 'input', coalesce(sum(input_tokens), 0) - (SELECT coalesce(sum(t), 0) FROM x), coalesce(sum(coalesce(overage_input_tokens, input_tokens)), 0),
				coalesce(sum(coalesce(overage_input_tokens, input_tokens)) FILTER (WHERE billing_status = 'billed'), 0) FROM l
			UNION ALL SELECT 'output', coalesce(sum(output_tokens), 0), coalesce(sum(coalesce(overage_output_tokens, output_tokens)), 0),
				coalesce(sum(coalesce(overage_output_tokens, output_tokens)) FILTER (WHERE billing_status = 'billed'), 0) FROM l
			UNION ALL SELECT k, sum(t), sum(o), coalesce(sum(o) FILTER (WHERE billing_status = 'billed'), 0) FROM x GROUP BY k`, tn.ID)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var k string
			var v [3]int64
			if err := rows.Scan(&k, &v[0], &v[1], &v[2]); err != nil {
				t.Fatal(err)
			}
			want[k] = v
		}
		rows.Close()
		for _, m := range usage.Meters {
			if w := want[m.Meter]; m.Used != w[0] || m.Overage != w[1] || m.Billed != w[2] || m.Pending != 0 {
				t.Fatalf("GET /v1/usage of %s: meter %s used %d overage %d billed %d pending %d; the logs: %v", tn.ID, m.Meter, m.Used, m.Overage, m.Billed, m.Pending, w)
			}
		}
		if len(usage.Meters) < 2 {
			t.Fatalf("GET /v1/usage of %s: %+v", tn.ID, usage)
		}
	}

	// The finance statement agrees with the rows.
	out, _, err = runCmd(t, map[string]string{"DATABASE_URL": dbURL}, "status", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var status struct {
		Totals struct {
			UsageLogs          int   `json:"usage_logs"`
			Billed             int   `json:"billed"`
			NotBillable        int   `json:"not_billable"`
			Pending            int   `json:"pending"`
			BilledInputTokens  int64 `json:"billed_input_tokens"`
			BilledOutputTokens int64 `json:"billed_output_tokens"`
		} `json:"totals"`
	}
	if err := json.Unmarshal([]byte(out), &status); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	var billedIn, billedOut int64
	for k, v := range want {
		if k.EventName == "llm_input_tokens" || k.EventName == chaosCacheEvent {
			billedIn += v
		} else {
			billedOut += v
		}
	}
	tot := status.Totals
	if tot.UsageLogs != count("SELECT count(*) FROM usage_logs") || tot.Billed != count("SELECT count(*) FROM usage_logs WHERE billing_status = 'billed'") ||
		tot.NotBillable != count("SELECT count(*) FROM usage_logs WHERE billing_status = 'not_billable'") || tot.Pending != 0 || tot.BilledInputTokens != billedIn || tot.BilledOutputTokens != billedOut {
		t.Fatalf("overage status disagrees with the rows: %+v (billed tokens %d/%d)", tot, billedIn, billedOut)
	}

	outcomes := map[string]int{}
	for _, r := range emu.Requests() {
		outcomes[r.Outcome]++
	}
	if outcomes[emulator.OutcomeLostResponse] == 0 || outcomes[emulator.OutcomeFaultServerError] == 0 {
		t.Fatalf("the faults did not happen: %v", outcomes)
	}
	if n := count("SELECT count(*) FROM usage_logs WHERE corrects IS NOT NULL"); n < events/10 {
		t.Fatalf("%d corrections recorded, want at least %d", n, events/10)
	}
	t.Logf("%d events, %d billable, %d meter events applied; emulator outcomes %v", events, billable, len(emu.Events()), outcomes)
}

// chaosCacheEvent is the event name of the chaos run's cache-read meter.
const chaosCacheEvent = "llm_cache_read_tokens"

// chaosAdminToken is the chaos server's ADMIN_TOKEN: corrections are an
// operator's, of any tenant's log.
const chaosAdminToken = "chaos-admin-token-0123456789abcdef"

// correctWave posts, for every event i whose i%10 is in which, the
// correction pick returns (corrected totals; twice: send it again under the
// same key, as a client retrying a lost answer would), as the operator.
func correctWave(t *testing.T, addr string, pool *pgxpool.Pool, events int, pick func(i, in, out int) (int, int, bool), which []int) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT u.id::text, u.request_id, u.input_tokens + coalesce((SELECT sum(c.input_tokens) FROM usage_logs c WHERE c.corrects = u.id), 0),
			u.output_tokens + coalesce((SELECT sum(c.output_tokens) FROM usage_logs c WHERE c.corrects = u.id), 0)
		FROM usage_logs u WHERE u.corrects IS NULL AND u.request_id LIKE 'req-%'`)
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		id      string
		i       int
		in, out int
	}
	var targets []target
	for rows.Next() {
		var tg target
		var rid string
		if err := rows.Scan(&tg.id, &rid, &tg.in, &tg.out); err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Sscanf(rid, "req-%d", &tg.i); err != nil {
			t.Fatal(err)
		}
		for _, w := range which {
			if tg.i%10 == w && tg.i < events {
				targets = append(targets, tg)
			}
		}
	}
	rows.Close()
	for _, tg := range targets {
		in, out, twice := pick(tg.i, tg.in, tg.out)
		if in == tg.in && out == tg.out {
			continue
		}
		body := fmt.Sprintf(`{"input_tokens":%d,"output_tokens":%d,"reason":"chaos"}`, in, out)
		key := fmt.Sprintf("fix-%s-%d-%d", tg.id, in, out)
		for range 1 + map[bool]int{true: 1}[twice] {
			req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/usage-events/"+tg.id+"/corrections", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+chaosAdminToken)
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("correction: %v", err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusAccepted {
				t.Fatalf("correction of event %d: %d %s", tg.i, res.StatusCode, b)
			}
		}
	}
}

func postEvent(t *testing.T, addr, apiKey, key, body string) int {
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/usage-events", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	for attempt := 0; ; attempt++ {
		res, err := httpClient.Do(req)
		if err != nil {
			t.Errorf("post: %v", err)
			return 0
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusConflict && attempt < 50 { // in progress: retry
			time.Sleep(20 * time.Millisecond)
			req.Body = io.NopCloser(strings.NewReader(body))
			continue
		}
		return res.StatusCode
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
