//go:build dev

package main

import (
	"context"
	cryptorand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/term"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/client"
	"github.com/overage-billing/overage/internal/billingtest"
	"github.com/overage-billing/overage/internal/poll"
	"github.com/overage-billing/overage/internal/testkit/flakyproxy"
	"github.com/overage-billing/overage/internal/testkit/pgcontainer"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/usagelog"
)

// cmdDev runs everything in one process for trying it out: a database
// (DATABASE_URL, else testcontainers), the migrations, the API, the workers
// and the sweep; without STRIPE_SECRET_KEY, the built-in Stripe emulator
// and a demo burst of usage through the Go client that shows every event
// billed exactly once.
func cmdDev(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "dev", devSynopsis)
	events := fs.Int("events", 300, "usage events in the demo burst")
	keep := fs.Bool("keep-running", false, "keep serving after the demo, printing the URL and a curl command")
	cfg, err := loadConfig(e, fs, args)
	if err != nil {
		return err
	}
	// Short sweeps so the demo finishes in seconds; the environment wins.
	if e.getenv("SWEEP_INTERVAL") == "" {
		cfg.SweepInterval = 2 * time.Second
	}
	if e.getenv("SWEEP_GRACE") == "" {
		cfg.SweepGrace = 3 * time.Second
	}
	if e.getenv("REPORT_JOB_TIMEOUT") == "" {
		cfg.ReportJobTimeout = 10 * time.Second
	}
	if e.getenv("LOG_LEVEL") == "" {
		cfg.LogLevel = slog.LevelError // the terminal shows progress instead
	}
	logger := app.NewLogger(e.stderr, cfg.LogLevel)
	out := e.stdout

	var emu *emulator.Emulator
	if cfg.StripeSecretKey == "" {
		// Faults on purpose: the demo shows that lost answers and errors
		// never bill twice.
		emu = emulator.New(emulator.Options{Seed: rand.Int64(), Faults: emulator.Faults{
			LostResponseRate: 0.10, ServerErrorRate: 0.05, RateLimitRate: 0.05, Latency: 2 * time.Millisecond,
		}})
		base, err := emu.Start("127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("start the Stripe emulator: %w", err)
		}
		defer emu.Close()
		cfg.StripeSecretKey, cfg.StripeAPIBase = "sk_test_overagedev", base
		fmt.Fprintf(out, "overage dev: reporting to the built-in Stripe emulator at %s — STRIPE_SECRET_KEY is unset, nothing is sent to Stripe\n", base)
	} else {
		fmt.Fprintf(out, "overage dev: reporting to %s with STRIPE_SECRET_KEY\n", cfg.StripeAPIBase)
	}

	dbURL, stopDB, err := devDatabase(ctx, cfg.DatabaseURL, out)
	if err != nil {
		return err
	}
	defer stopDB()
	pool, err := app.OpenPool(ctx, dbURL, app.WorkMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Migrate(ctx, pool, logger); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}

	// The operator endpoints and River UI need a token: the demo makes one
	// unless ADMIN_TOKEN names it, and prints it below.
	generatedToken := cfg.AdminToken == ""
	if generatedToken {
		// Two texts: 52 characters, over the 32 ADMIN_TOKEN needs.
		cfg.AdminToken = cryptorand.Text() + cryptorand.Text()
	}
	srv, err := app.NewServerOn(pool, cfg, logger)
	if errors.Is(err, syscall.EADDRINUSE) {
		fmt.Fprintf(out, "%s is in use; listening on a free port instead\n", cfg.ListenAddr)
		cfg.ListenAddr = "127.0.0.1:0"
		srv, err = app.NewServerOn(pool, cfg, logger)
	}
	if err != nil {
		return err
	}
	defer srv.Close()
	// The workers' Stripe call metrics join the server's, so /metrics
	// shows them.
	w, err := app.NewWorkers(pool, cfg, logger, srv.Registry)
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	for _, run := range []func(context.Context) error{srv.Run, w.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(runCtx); err != nil {
				errc <- err
			}
		}()
	}
	defer wg.Wait()
	defer stop()
	baseURL := "http://" + srv.Addr()
	fmt.Fprintf(out, "API on %s, workers and the sweep running\n", baseURL)

	var demoKey string
	if emu != nil && *events > 0 {
		d := &demo{pool: pool, emu: emu, baseURL: baseURL, out: out, events: *events, tty: isTTY(out),
			inputEvent: cfg.MeterInputEvent, outputEvent: cfg.MeterOutputEvent}
		if err := d.run(runCtx); err != nil {
			return err
		}
		demoKey = d.keys[0]
	}

	if !*keep {
		return nil
	}
	if demoKey == "" {
		demoKey = "<a tenant API key from: overage tenant create --name NAME --stripe-customer cus_...>"
	}
	fmt.Fprintf(out, "\nServing on %s until Ctrl-C. Try:\n\n  curl -sS %s/v1/usage-events \\\n    -H 'Authorization: Bearer %s' \\\n    -H 'Idempotency-Key: my-first-event' -H 'Content-Type: application/json' \\\n    -d '{\"request_id\":\"my-first-event\",\"user_id\":\"u_1\",\"model_id\":\"gpt-4o\",\"input_tokens\":1200,\"output_tokens\":350}'\n\n", baseURL, baseURL, demoKey)
	printAdminAccess(out, baseURL, cfg.AdminToken, generatedToken)
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// devDatabase returns a database URL that answers: DATABASE_URL (creating
// its database when the server answers but the database is missing), else
// a PostgreSQL started by testcontainers-go, else an error saying how to
// provide one.
func devDatabase(ctx context.Context, dbURL string, out io.Writer) (string, func(), error) {
	noop := func() {}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, dbURL)
	if err == nil {
		_ = conn.Close(ctx)
		fmt.Fprintf(out, "database: %s\n", redactURL(dbURL))
		return dbURL, noop, nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "3D000" { // invalid_catalog_name: the server answers, the database is missing
		if err := createDatabase(ctx, dbURL); err != nil {
			return "", noop, err
		}
		fmt.Fprintf(out, "database: created %s\n", redactURL(dbURL))
		return dbURL, noop, nil
	}
	connectErr := err
	fmt.Fprintf(out, "database: %s does not answer (%v); trying Docker\n", redactURL(dbURL), shortErr(connectErr))
	tctx, tcancel := context.WithTimeout(ctx, 3*time.Minute)
	defer tcancel()
	u, terminate, err := pgcontainer.Start(tctx)
	if err != nil {
		return "", noop, fmt.Errorf("no PostgreSQL: DATABASE_URL (%s) does not answer (%v) and Docker is not available (%v); start PostgreSQL and set DATABASE_URL=postgres://USER@HOST:5432/overage?sslmode=disable, or start Docker",
			redactURL(dbURL), shortErr(connectErr), shortErr(err))
	}
	fmt.Fprintf(out, "database: a throwaway PostgreSQL in Docker (%s), removed on exit\n", pgcontainer.Image)
	return u, func() { _ = terminate(context.Background()) }, nil
}

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "DATABASE_URL"
	}
	return u.Redacted()
}

func shortErr(err error) string {
	s := err.Error()
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

func isTTY(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
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
	// The meter event names the workers report under.
	inputEvent, outputEvent string

	tenantIDs []string
	customers []string
	keys      []string

	proxy *flakyproxy.Proxy

	sent, accepted, replays, duplicates atomic.Int64
}

func (d *demo) run(ctx context.Context) error {
	store := tenants.NewStore(d.pool)
	run := fmt.Sprintf("%04x", rand.IntN(1<<16))
	for _, t := range []tenants.CreateParams{
		{Name: "Acme (demo " + run + ")", StripeCustomerID: "cus_demo_acme_" + run},
		{Name: "Globex (demo " + run + ")", StripeCustomerID: "cus_demo_globex_" + run, IncludedInputTokens: 100_000, IncludedOutputTokens: 20_000},
	} {
		c, err := store.Create(ctx, t)
		if err != nil {
			return fmt.Errorf("create demo tenant: %w", err)
		}
		d.tenantIDs = append(d.tenantIDs, c.ID.String())
		d.customers = append(d.customers, c.StripeCustomerID)
		d.keys = append(d.keys, c.APIKey)
		allowance := "no allowance: all usage is overage"
		if t.IncludedInputTokens > 0 {
			allowance = fmt.Sprintf("%d input and %d output tokens included", t.IncludedInputTokens, t.IncludedOutputTokens)
		}
		fmt.Fprintf(d.out, "tenant %-21s %-22s API key %s  (%s)\n", t.Name, c.StripeCustomerID, c.APIKey, allowance)
	}

	// One answer in ten is lost after the server committed it.
	proxy, err := flakyproxy.New(d.baseURL, func() flakyproxy.Fault {
		if rand.IntN(10) == 0 {
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

	fmt.Fprintf(d.out, "sending %d usage events through the Go client; the network loses 1 answer in 10, the Stripe emulator loses 10%% of its answers and fails 10%% of calls\n", d.events)
	progressDone := make(chan struct{})
	stopProgress := d.progress(ctx, progressDone)
	err = d.send(ctx, "http://"+ln.Addr().String())
	if err == nil {
		err = d.waitBilled(ctx)
	}
	stopProgress()
	<-progressDone
	if err != nil {
		return err
	}
	return d.report(ctx)
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
					RequestID: fmt.Sprintf("demo-%d", i), UserID: fmt.Sprintf("user-%d", i%17), ModelID: []string{"gpt-4o", "claude-sonnet", "llama-70b"}[i%3],
					InputTokens: int64(800 + (i*7919)%2400), OutputTokens: int64(150 + (i*104729)%600),
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

// counts returns the demo tenants' logs by billing status.
func (d *demo) counts(ctx context.Context) (map[overage.BillingStatus]int64, error) {
	return usagelog.CountByStatus(ctx, d.pool, d.tenantIDs)
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
		return fmt.Sprintf("sent %d  accepted %d  billed %d  not billable %d  pending %d",
			d.sent.Load(), d.accepted.Load(), c[usagelog.StatusBilled], c[usagelog.StatusNotBillable], c[usagelog.StatusPending])
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

func (d *demo) waitBilled(ctx context.Context) error {
	return poll.Wait(ctx, "every demo usage log to leave pending", 3*time.Minute, 100*time.Millisecond, func() (bool, error) {
		c, err := d.counts(ctx)
		return err == nil && c[usagelog.StatusPending] == 0, err
	})
}

// report prints the finance view of the demo tenants and checks it against
// what the emulator applied; any disagreement is an error.
func (d *demo) report(ctx context.Context) error {
	c, err := d.counts(ctx)
	if err != nil {
		return err
	}
	lost := 0
	for _, s := range d.proxy.Seen() {
		if s.Fault == flakyproxy.DropAfterCommit {
			lost++
		}
	}
	fmt.Fprintf(d.out, "\n%d events: %d sends, %d answers lost after the server committed (each retried with its key), %d resends replayed, %d duplicate request_ids: %d usage logs\n",
		d.accepted.Load(), d.sent.Load(), lost, d.replays.Load(), d.duplicates.Load(), c[usagelog.StatusBilled]+c[usagelog.StatusNotBillable]+c[usagelog.StatusPending]+c[usagelog.StatusFailed]+c[usagelog.StatusNeedsReview])

	rows, err := d.pool.Query(ctx, `SELECT t.stripe_customer_id, count(*),
			count(*) FILTER (WHERE u.billing_status = $2), count(*) FILTER (WHERE u.billing_status = $3),
			count(*) FILTER (WHERE u.billing_status NOT IN ($2, $3))
		FROM usage_logs u JOIN tenants t ON t.id = u.tenant_id WHERE u.tenant_id = ANY($1::uuid[])
		GROUP BY 1 ORDER BY 1`, d.tenantIDs, usagelog.StatusBilled, usagelog.StatusNotBillable)
	if err != nil {
		return fmt.Errorf("demo logs per customer: %w", err)
	}
	type row struct {
		customer                            string
		logs, billed, notBillable, unbilled int
	}
	var all []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.customer, &r.logs, &r.billed, &r.notBillable, &r.unbilled); err != nil {
			return fmt.Errorf("demo logs per customer: %w", err)
		}
		all = append(all, r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("demo logs per customer: %w", err)
	}
	billed, err := billingtest.Billed(ctx, d.pool, d.inputEvent, d.outputEvent, d.tenantIDs...)
	if err != nil {
		return err
	}
	applied := d.emu.Applied()
	disagreement := billingtest.Disagreement(d.emu, billed)
	ok := disagreement == ""
	fmt.Fprintf(d.out, "\n%-26s %6s %7s %13s %9s %-18s %14s %14s %6s\n", "customer", "logs", "billed", "not_billable", "unbilled", "meter", "billed (db)", "stripe (emu)", "agree")
	for _, r := range all {
		for _, meter := range []string{d.inputEvent, d.outputEvent} {
			k := emulator.AppliedKey{Customer: r.customer, EventName: meter}
			agree := applied[k] == billed[k] && r.unbilled == 0
			ok = ok && agree
			fmt.Fprintf(d.out, "%-26s %6d %7d %13d %9d %-18s %14d %14d %6s\n", r.customer, r.logs, r.billed, r.notBillable, r.unbilled, meter, billed[k], applied[k], yesNo(agree))
		}
	}
	outcomes := map[string]int{}
	for _, r := range d.emu.Requests() {
		outcomes[r.Outcome]++
	}
	fmt.Fprintf(d.out, "\nStripe emulator: %d meter events applied from %d calls (%d answers lost, %d 5xx, %d 429, %d replays of a saved answer)\n",
		len(d.emu.Events()), len(d.emu.Requests()), outcomes[emulator.OutcomeLostResponse], outcomes[emulator.OutcomeFaultServerError],
		outcomes[emulator.OutcomeFaultRateLimit]+outcomes[emulator.OutcomeConcurrentRateLimit], outcomes[emulator.OutcomeReplayed])
	if !ok {
		if disagreement == "" {
			disagreement = "some demo usage logs are not billed"
		}
		return fmt.Errorf("the emulator and the database disagree: %s", strings.ReplaceAll(disagreement, "\n", "; "))
	}
	fmt.Fprintf(d.out, "every demo event billed exactly once: the emulator's totals equal the database's\n")
	return nil
}

// printAdminAccess prints the admin token of the demo with commands to
// paste: the finance status, the tenants, and River UI in a browser.
func printAdminAccess(out io.Writer, baseURL, token string, generated bool) {
	origin := "from ADMIN_TOKEN"
	if generated {
		origin = "made for this run; set ADMIN_TOKEN to choose your own"
	}
	fmt.Fprintf(out, "Admin token (%s):\n\n  %s\n\n", origin, token)
	fmt.Fprintf(out, "Finance status and tenants:\n\n  curl -sS -H 'Authorization: Bearer %s' %s/v1/billing/status\n  curl -sS -H 'Authorization: Bearer %s' %s/v1/tenants\n\n",
		token, baseURL, token, baseURL)
	fmt.Fprintf(out, "River UI (the job queue): open %s/riverui/ in a browser and sign in with the admin token,\nor from a shell:\n\n  curl -sS -H 'Authorization: Bearer %s' '%s/riverui/api/jobs?state=available'\n\n",
		baseURL, token, baseURL)
}
