//go:build dev

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/internal/testkit/pgcontainer"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/syncbuf"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/workers"
	"math/rand/v2"
)

func TestDevDemoBillsEveryEventExactlyOnce(t *testing.T) {
	t.Parallel()
	pool, dbURL := pgtest.NewPool(t)
	// A meter name other than the default: the demo compares what the
	// workers reported under, not a name of its own. 300 events (the
	// default) make about 120 Stripe calls, so a run in which no injected
	// fault happens is as likely as 0.9^100.
	env := map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0", "STRIPE_METER_INPUT_EVENT": "demo_input_tokens"}
	out, _, err := runCmd(t, env, "dev", "--events", "300")
	if err != nil {
		t.Fatalf("overage dev: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.Contains(lines[0], "built-in Stripe emulator") || !strings.Contains(lines[0], "nothing is sent to Stripe") {
		t.Fatalf("first line does not say where usage is reported: %q", lines[0])
	}
	if !strings.Contains(lines[len(lines)-1], "every demo event billed exactly once") {
		t.Fatalf("last line: %q\n%s", lines[len(lines)-1], out)
	}
	tables := demoTables(t, out)
	if got := tables.value(t, "Requests to the API", "first sends, one per event", 0); got != 300 {
		t.Errorf("first sends = %d, want 300:\n%s", got, out)
	}
	if got := tables.value(t, "Usage logs of this run", "= stored, one per event", 2); got != 300 {
		t.Errorf("usage logs stored = %d, want 300:\n%s", got, out)
	}
	// The faults it announces happen and show.
	if got := tables.value(t, "Requests to the API", "+ resent after the network lost the answer", 0); got == 0 {
		t.Errorf("the network lost no answer of 350 requests:\n%s", out)
	}
	lost := tables.value(t, "Calls to Stripe (the emulator)", "+ applied, answer lost (injected: 10% of those applied)", 0)
	e500 := tables.value(t, "Calls to Stripe (the emulator)", "+ 500 before applying (injected: 5%)", 0)
	e429 := tables.value(t, "Calls to Stripe (the emulator)", "+ 429 before applying (injected: 5%)", 0)
	if lost == 0 || lost+e500+e429 == 0 {
		t.Errorf("the emulator's injected faults do not show (%d answers lost, %d 500, %d 429):\n%s", lost, e500, e429, out)
	}
	// Every meter-event call the emulator got is in the table, and its
	// applied events are those answered plus those whose answer was lost.
	var calls int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM usage_reports WHERE state = 'accepted'`).Scan(&calls); err != nil {
		t.Fatal(err)
	}
	if applied := tables.value(t, "Calls to Stripe (the emulator)", "meter events applied", 0); applied != int64(calls) {
		t.Errorf("%d meter events applied, but the database accepted %d reports:\n%s", applied, calls, out)
	}
	if !strings.Contains(out, " demo_input_tokens ") || strings.Contains(out, " llm_input_tokens ") {
		t.Fatalf("the table does not show the configured input meter:\n%s", out)
	}
	if strings.Contains(out, " no\n") {
		t.Fatalf("a row disagrees:\n%s", out)
	}
	// The demo's per-model and cache-read meters were fed and billed.
	for _, ev := range []string{"demo_gpt4o_input_tokens", "demo_cache_read_tokens"} {
		m := regexp.MustCompile(`(?m)^.*Acme \(demo\)\s+` + ev + `\s+([0-9,]+)\s+([0-9,]+)\s+yes`).FindStringSubmatch(out)
		if m == nil || m[1] == "0" || m[1] != m[2] {
			t.Fatalf("no billed tokens on the demo meter %s:\n%s", ev, out)
		}
	}
	if regexp.MustCompile(`(^|[^0-9,])1 [a-z_]+s\b`).MatchString(out) {
		t.Errorf("a plural after 1:\n%s", out)
	}
}

// TestDevDemoTwiceReusesItsTenants runs the demo twice on one database:
// the second run reuses the demo's two tenants, with one live API key
// each, and counts only its own events.
func TestDevDemoTwiceReusesItsTenants(t *testing.T) {
	t.Parallel()
	pool, dbURL := pgtest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0"}
	var tenantCounts []int
	for run := range 2 {
		out, _, err := runCmd(t, env, "dev", "--events", "40")
		if err != nil {
			t.Fatalf("run %d: %v\n%s", run+1, err, out)
		}
		if want := map[int]string{0: "created", 1: "reused"}[run]; strings.Count(out, ", API key ovg_") != 2 || strings.Count(out, " "+want+", API key ovg_") != 2 {
			t.Errorf("run %d does not say both tenants were %s:\n%s", run+1, want, out)
		}
		if got := demoTables(t, out).value(t, "Usage logs of this run", "= stored, one per event", 2); got != 40 {
			t.Errorf("run %d counts %d usage logs, want its own 40:\n%s", run+1, got, out)
		}
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM tenants`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		tenantCounts = append(tenantCounts, n)
	}
	if tenantCounts[0] != 2 || tenantCounts[1] != 2 {
		t.Errorf("tenants after each run: %v, want [2 2]", tenantCounts)
	}
	var live, logs int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM api_keys WHERE revoked_at IS NULL), (SELECT count(*) FROM usage_logs)`).Scan(&live, &logs); err != nil {
		t.Fatal(err)
	}
	if live != 2 || logs != 80 {
		t.Errorf("after two runs: %d live API keys (want 2, this run's), %d usage logs (want 80)", live, logs)
	}
}

// TestDevDemoTablesAddUp checks the closing tables' sums on counts that
// exercise every row: a fault that did not happen is still listed (as 0),
// an unexpected outcome is listed by name, and 1 takes the singular.
func TestDevDemoTablesAddUp(t *testing.T) {
	ts := []demoTenant{{id: uuid.New(), name: "Acme", customer: "cus_a"}, {id: uuid.New(), name: "Globex", customer: "cus_g"}}
	logs := runLogs{ts[0].id: {"billed": 7, "pending": 1}, ts[1].id: {"billed": 2, "not_billable": 3, "needs_review": 1}}
	calls := map[string]int64{emulator.OutcomeApplied: 9, emulator.OutcomeLostResponse: 1, emulator.OutcomeReplayed: 1,
		emulator.OutcomeClientGone: 2, "something_new": 1}
	var b strings.Builder
	writeRows(&b, requestRows(14, 2, 1, 1, 19))
	b.WriteString("\n")
	writeRows(&b, logRows(ts, logs))
	b.WriteString("\n")
	writeRows(&b, callRows(calls, demoStripeFaults, 10))
	out := b.String()
	tables := demoTables(t, out)
	if got := tables.value(t, "Requests to the API", "+ retried after a 429 or 5xx answer", 0); got != 1 {
		t.Errorf("retries = %d, want the 1 request unaccounted for:\n%s", got, out)
	}
	if got := tables.value(t, "Usage logs of this run", "+ needs review", 1); got != 1 {
		t.Errorf("needs review of Globex = %d, want 1:\n%s", got, out)
	}
	if got := tables.value(t, "Calls to Stripe (the emulator)", "+ 500 before applying (injected: 5%)", 0); got != 0 {
		t.Errorf("500s = %d, want a row of 0:\n%s", got, out)
	}
	if got := tables.value(t, "Calls to Stripe (the emulator)", "+ something new", 0); got != 1 {
		t.Errorf("an unknown outcome is not listed:\n%s", out)
	}
	if plural(1, "answer", "answers") != "1 answer" || plural(2, "answer", "answers") != "2 answers" || plural(1234, "log", "logs") != "1,234 logs" {
		t.Error("plural")
	}
	// A table that does not add up fails the check.
	bad := regexp.MustCompile(`(= calls\s+)14`).ReplaceAllString(out, "${1}15")
	if bad == out {
		t.Fatalf("could not corrupt the calls total:\n%s", out)
	}
	if err := checkSums(parseTables(bad)); err == nil {
		t.Errorf("a wrong total passed:\n%s", bad)
	}
}

// demoTable is one closing table of the demo: its title and its rows'
// labels and numbers.
type demoTable struct {
	title string
	rows  []demoTableRow
}

type demoTableRow struct {
	label string
	nums  []int64
}

type demoTableSet map[string]demoTable

// demoTables parses the closing tables of the demo's output and fails t
// unless each adds up: its first row plus its "+ " rows equals its "= "
// row, in every column.
func demoTables(t *testing.T, out string) demoTableSet {
	t.Helper()
	set := parseTables(out)
	for _, title := range []string{"Requests to the API", "Usage logs of this run", "Calls to Stripe (the emulator)"} {
		if _, ok := set[title]; !ok {
			t.Fatalf("no table %q in:\n%s", title, out)
		}
	}
	if err := checkSums(set); err != nil {
		t.Fatalf("%v in:\n%s", err, out)
	}
	return set
}

func (s demoTableSet) value(t *testing.T, title, label string, col int) int64 {
	t.Helper()
	for _, r := range s[title].rows {
		if r.label == label && col < len(r.nums) {
			return r.nums[col]
		}
	}
	t.Fatalf("table %q has no row %q with a column %d: %+v", title, label, col, s[title])
	return 0
}

var tableCells = regexp.MustCompile(`\s{2,}`)

// parseTables reads every block of lines whose first line is a title and
// whose others are indented rows: a label, then numbers, then a note, each
// two or more spaces apart.
func parseTables(out string) demoTableSet {
	set := demoTableSet{}
	for _, block := range strings.Split(out, "\n\n") {
		lines := strings.Split(strings.Trim(block, "\n"), "\n")
		if len(lines) < 2 || strings.HasPrefix(lines[0], " ") || !strings.HasPrefix(lines[1], "  ") {
			continue
		}
		tb := demoTable{title: strings.TrimSpace(tableCells.Split(lines[0], 2)[0])}
		for _, l := range lines[1:] {
			cells := tableCells.Split(strings.TrimSpace(l), -1)
			r := demoTableRow{label: cells[0]}
			for _, c := range cells[1:] {
				n, err := strconv.ParseInt(strings.ReplaceAll(c, ",", ""), 10, 64)
				if err != nil {
					break
				}
				r.nums = append(r.nums, n)
			}
			tb.rows = append(tb.rows, r)
		}
		set[tb.title] = tb
	}
	return set
}

// checkSums says which table does not add up, if any.
func checkSums(set demoTableSet) error {
	for _, tb := range set {
		if len(tb.rows) == 0 || strings.HasPrefix(tb.rows[0].label, "+ ") {
			continue
		}
		sum := append([]int64(nil), tb.rows[0].nums...)
		totalled := false
		for _, r := range tb.rows[1:] {
			switch {
			case strings.HasPrefix(r.label, "+ "):
				for i := range min(len(sum), len(r.nums)) {
					sum[i] += r.nums[i]
				}
			case strings.HasPrefix(r.label, "= "):
				if fmt.Sprint(sum) != fmt.Sprint(r.nums) {
					return fmt.Errorf("table %q: the rows add up to %v, its %q row says %v", tb.title, sum, r.label, r.nums)
				}
				totalled = true
			}
		}
		if !totalled && len(tb.rows) > 2 && tb.title != "Overage tokens" {
			return fmt.Errorf("table %q has no total row", tb.title)
		}
	}
	if tb, ok := set["Calls to Stripe (the emulator)"]; ok {
		var applied, answered, lost int64 = -1, -1, -1
		for _, r := range tb.rows {
			if len(r.nums) == 0 {
				continue
			}
			switch {
			case r.label == "meter events applied":
				applied = r.nums[0]
			case r.label == "applied and answered":
				answered = r.nums[0]
			case strings.HasPrefix(r.label, "+ applied, answer lost"):
				lost = r.nums[0]
			}
		}
		if applied != answered+max(lost, 0) {
			return fmt.Errorf("%d meter events applied, but %d answered and %d answers lost", applied, answered, lost)
		}
	}
	return nil
}

func TestDevCreatesAMissingDatabase(t *testing.T) {
	t.Parallel()
	server := pgtest.ServerURL(t)
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	// Unique per run: every work tree's tests share this server, and a
	// fixed name would let one run's cleanup drop another's database.
	name := fmt.Sprintf("ovgtest_devcreate_%d", rand.Int64())
	u.Path = "/" + strings.ToLower(name)
	t.Cleanup(func() {
		if c, err := pgx.Connect(context.Background(), server); err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+strings.ToLower(name)+" WITH (FORCE)")
			c.Close(context.Background())
		}
	})
	var out strings.Builder
	got, stop, err := devDatabase(context.Background(), u.String(), &out)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if got != u.String() || !strings.Contains(out.String(), "created") {
		t.Fatalf("devDatabase = %q, printed %q", got, out.String())
	}
	c, err := pgx.Connect(context.Background(), got)
	if err != nil {
		t.Fatalf("the created database does not answer: %v", err)
	}
	c.Close(context.Background())
}

// unanswered is a DATABASE_URL nothing answers (port 1), so devDatabase
// turns to Docker.
const unanswered = "postgres://postgres@127.0.0.1:1/overage?sslmode=disable&connect_timeout=2"

// TestDevStartsPostgreSQLInDocker runs the Docker path wherever a Docker
// engine answers: the container's database answers, and is gone once the
// demo stops.
func TestDevStartsPostgreSQLInDocker(t *testing.T) {
	t.Parallel()
	if err := pgcontainer.DockerAnswers(t.Context()); err != nil {
		t.Skipf("no Docker engine answers, so there is no Docker path to test here: %v", err)
	}
	var out strings.Builder
	got, stop, err := devDatabase(t.Context(), unanswered, &out)
	if err != nil {
		t.Fatalf("a Docker engine answers, yet: %v\n%s", err, out.String())
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	if !strings.Contains(out.String(), "throwaway PostgreSQL in Docker") {
		t.Errorf("devDatabase printed %q", out.String())
	}
	c, err := pgx.Connect(t.Context(), got)
	if err != nil {
		t.Fatalf("the container's database does not answer: %v", err)
	}
	var one int
	if err := c.QueryRow(t.Context(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
	_ = c.Close(t.Context())
	stop()
	stopped = true
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if c, err := pgx.Connect(ctx, got); err == nil {
		_ = c.Close(ctx)
		t.Fatal("the container's database still answers after stop")
	}
}

// TestDevSaysHowToProvideADatabase takes the path where neither
// DATABASE_URL nor Docker answers; where an engine answers, that path is
// not reachable (TestDevStartsPostgreSQLInDocker runs instead).
func TestDevSaysHowToProvideADatabase(t *testing.T) {
	t.Parallel()
	if pgcontainer.DockerAnswers(t.Context()) == nil {
		t.Skip("a Docker engine answers: devDatabase starts a container instead of failing")
	}
	var out strings.Builder
	_, stop, err := devDatabase(t.Context(), unanswered, &out)
	if err == nil {
		stop()
		t.Fatalf("no Docker engine answers, yet devDatabase found a database:\n%s", out.String())
	}
	for _, want := range []string{"DATABASE_URL", "Docker", "postgres://"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

// TestDevKeepRunningPrintsAdminAccess runs the demo server and uses what
// it prints: the admin token opens the finance status, the tenants and
// River UI; /metrics carries the workers' Stripe call metrics too.
func TestDevKeepRunningPrintsAdminAccess(t *testing.T) {
	t.Parallel()
	for _, given := range []string{"", "admin-token-from-env-0123456789abcdef"} {
		env := map[string]string{"DATABASE_URL": pgtest.NewDatabase(t), "LISTEN_ADDR": "127.0.0.1:0", "ADMIN_TOKEN": given}
		ctx, cancel := context.WithCancel(context.Background())
		var out syncbuf.Buffer
		done := make(chan error, 1)
		started := time.Now()
		go func() {
			// A few events with the generated token, so Stripe was called.
			events := map[bool]string{true: "3", false: "0"}[given == ""]
			done <- run(ctx, []string{"dev", "--events", events, "--keep-running"}, &out, io.Discard, func(k string) string { return env[k] })
		}()
		polltest.Until(t, "the demo to print its admin access", 60*time.Second, func() bool { return strings.Contains(out.String(), "/riverui/api/jobs") })
		demoTook := time.Since(started)
		printed := out.String()
		token := regexp.MustCompile(`Admin token \([^)]*\):\n\n  (\S+)\n`).FindStringSubmatch(printed)
		base := regexp.MustCompile(`Serving on (http://\S+) until`).FindStringSubmatch(printed)
		if token == nil || base == nil || (given != "" && token[1] != given) || (given == "" && len(token[1]) < app.MinAdminTokenLen) {
			t.Fatalf("ADMIN_TOKEN=%q: no usable admin token or URL in:\n%s", given, printed)
		}
		for _, path := range []string{"/v1/billing/status", "/v1/tenants", "/riverui/api/jobs?state=available"} {
			if !strings.Contains(printed, "Authorization: Bearer "+token[1]+"' "+base[1]+path) && !strings.Contains(printed, "Authorization: Bearer "+token[1]+"' '"+base[1]+path) {
				t.Errorf("no ready-to-paste command for %s in:\n%s", path, printed)
			}
			req, _ := http.NewRequest(http.MethodGet, base[1]+path, nil)
			req.Header.Set("Authorization", "Bearer "+token[1])
			res, err := httpClient.Do(req)
			if err != nil || res.StatusCode != http.StatusOK {
				t.Fatalf("GET %s with the printed token: %v %v", path, res, err)
			}
			res.Body.Close()
		}
		res, err := httpClient.Get(base[1] + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		metricsText, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if given == "" && !strings.Contains(string(metricsText), "overage_stripe_calls_total") {
			t.Errorf("/metrics of overage dev lacks the Stripe call metrics")
		}
		// River UI lists the sweep the workers run on start and those the
		// demo asked for while it waited (one per SWEEP_GRACE at most), not
		// one every few seconds from then on.
		conn, err := pgx.Connect(context.Background(), env["DATABASE_URL"])
		if err != nil {
			t.Fatal(err)
		}
		var sweeps int
		err = conn.QueryRow(context.Background(), `SELECT count(*) FROM river_job WHERE kind = 'overage.sweep'`).Scan(&sweeps)
		conn.Close(context.Background())
		if most := 2 + int(demoTook/(2*time.Second)); err != nil || sweeps > most {
			t.Errorf("%d sweep jobs after a demo of %s (%v), want the one on start and at most one per 2 s the demo waited: %d", sweeps, demoTook, err, most)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("overage dev after Ctrl-C: %v", err)
		}
	}
}

// TestDevSettingsKeepTheProductionSweep: the demo sweeps on demand while
// it waits, not every few seconds, so River UI in --keep-running is not a
// list of completed sweep jobs; its reports are small enough for the
// emulator's faults to show. Each setting yields to the environment.
func TestDevSettingsKeepTheProductionSweep(t *testing.T) {
	for _, env := range []map[string]string{{}, {"SWEEP_INTERVAL": "5s", "REPORT_BATCH_MAX": "50", "SWEEP_GRACE": "1m"}} {
		var dev app.DevConfig
		if err := (app.Source{Getenv: func(k string) string { return env[k] }, Defaults: devDefaults}).Read(&dev); err != nil {
			t.Fatal(err)
		}
		cfg := dev.Work
		if dev.Serve.Log.Level != slog.LevelError {
			t.Errorf("the demo logs from %s, want errors only", dev.Serve.Log.Level)
		}
		if len(env) == 0 {
			if cfg.SweepInterval != workers.DefaultSweepInterval || cfg.BatchMax != demoReportBatchMax || cfg.SweepGrace >= time.Minute {
				t.Errorf("demo settings: sweep every %s (want %s), grace %s, REPORT_BATCH_MAX %d (want %d)",
					cfg.SweepInterval, workers.DefaultSweepInterval, cfg.SweepGrace, cfg.BatchMax, demoReportBatchMax)
			}
			continue
		}
		if cfg.SweepInterval != 5*time.Second || cfg.BatchMax != 50 || cfg.SweepGrace != time.Minute {
			t.Errorf("the environment does not win: sweep every %s, grace %s, REPORT_BATCH_MAX %d", cfg.SweepInterval, cfg.SweepGrace, cfg.BatchMax)
		}
	}
}

// TestDevDemoBillsWhatAnEarlierRunLeftPendingApart: a demo tenant's log
// left pending with no job (an earlier run stopped before billing it, its
// job lost) is billed by the next run — to that run's emulator — without
// mixing into the run's own tables or its comparison with the emulator.
func TestDevDemoBillsWhatAnEarlierRunLeftPendingApart(t *testing.T) {
	t.Parallel()
	pool, dbURL := pgtest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0", "ADMIN_TOKEN": "admin-token-of-the-earlier-run-0123456789"}
	created, _, err := runCmd(t, env, "tenant", "create", "--name", demoTenants[0].Name, "--stripe-customer", demoTenants[0].StripeCustomerID)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := startServer(t, env)
	req, _ := http.NewRequest(http.MethodPost, "http://"+srv.Addr()+"/v1/usage-events", strings.NewReader(`{"request_id":"earlier-run-1","user_id":"u","model_id":"m","input_tokens":1000,"output_tokens":100}`))
	req.Header.Set("Authorization", "Bearer "+mustField(t, created, "api_key"))
	req.Header.Set("Idempotency-Key", "earlier-run-1")
	req.Header.Set("Content-Type", "application/json")
	res, err := httpClient.Do(req)
	if err != nil || res.StatusCode != http.StatusAccepted {
		t.Fatalf("record the earlier run's event: %v %v", res, err)
	}
	res.Body.Close()
	if _, err := pool.Exec(context.Background(), `DELETE FROM river_job WHERE kind = 'overage.report_tenant'`); err != nil {
		t.Fatal(err)
	}

	out, _, err := runCmd(t, env, "dev", "--events", "40")
	if err != nil {
		t.Fatalf("overage dev: %v\n%s", err, out)
	}
	// Whether the demo saw it pending or the workers' first sweep billed
	// it before the demo looked, it is not counted as the run's own.
	t.Logf("reported first by the demo: %v", strings.Contains(out, "an earlier demo run left 1 usage log pending; reporting it first"))
	if got := demoTables(t, out).value(t, "Usage logs of this run", "= stored, one per event", 2); got != 40 {
		t.Errorf("the run counts %d usage logs, want its own 40:\n%s", got, out)
	}
	var billed, tenantsN int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM usage_logs WHERE billing_status IN ('billed', 'not_billable')), (SELECT count(*) FROM tenants)`).Scan(&billed, &tenantsN); err != nil {
		t.Fatal(err)
	}
	if billed != 41 || tenantsN != 2 {
		t.Errorf("%d usage logs billed or within the allowance (want the 40 and the earlier one), %d tenants (want 2)", billed, tenantsN)
	}
}
