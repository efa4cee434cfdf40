//go:build dev

package main

import (
	"context"
	cryptorand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/term"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/internal/testkit/pgcontainer"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/stripeclient/emulator"
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
	var cfg app.DevConfig
	if err := loadConfigWith(e, fs, args, devDefaults, &cfg); err != nil {
		return err
	}
	logger := app.NewLogger(e.stderr, cfg.Serve.Log.Level)
	out := e.stdout

	var emu *emulator.Emulator
	if cfg.Work.Stripe.SecretKey == "" {
		// Faults on purpose: the demo shows that lost answers and errors
		// never bill twice.
		emu = emulator.New(emulator.Options{Seed: rand.Int64(), Faults: demoStripeFaults})
		base, err := emu.Start("127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("start the Stripe emulator: %w", err)
		}
		defer emu.Close()
		cfg.Work.Stripe = app.StripeConfig{SecretKey: "sk_test_overagedev", APIBase: base}
		cfg.Serve.Stripe = cfg.Work.Stripe
		fmt.Fprintf(out, "overage dev: reporting to the built-in Stripe emulator at %s — STRIPE_SECRET_KEY is unset, nothing is sent to Stripe\n", base)
	} else {
		fmt.Fprintf(out, "overage dev: reporting to %s with STRIPE_SECRET_KEY\n", cfg.Work.Stripe.APIBase)
	}

	dbURL, stopDB, err := devDatabase(ctx, cfg.Serve.DB.URL, out)
	if err != nil {
		return err
	}
	defer stopDB()
	pool, err := app.OpenPool(ctx, dbURL, app.WorkPoolMaxConns+app.MaintenancePoolMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Migrate(ctx, pool, logger); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	// One process serves and works with one REPORT_BATCH_DELAY; a serve or
	// work on the same database may not.
	claim, err := app.CheckBatchDelay(ctx, dbURL, "dev", cfg.Work.Report.BatchDelay, logger)
	if err != nil {
		return err
	}
	defer claim.Close()

	// The operator endpoints and River UI need a token: the demo makes one
	// unless ADMIN_TOKEN names it, and prints it below.
	generatedToken := cfg.Serve.AdminToken == ""
	if generatedToken {
		// Two texts: 52 characters, over the 32 ADMIN_TOKEN needs.
		cfg.Serve.AdminToken = cryptorand.Text() + cryptorand.Text()
	}
	srv, err := app.NewServerOn(pool, &cfg.Serve, logger)
	if errors.Is(err, syscall.EADDRINUSE) {
		fmt.Fprintf(out, "%s is in use; listening on a free port instead\n", cfg.Serve.ListenAddr)
		cfg.Serve.ListenAddr = "127.0.0.1:0"
		srv, err = app.NewServerOn(pool, &cfg.Serve, logger)
	}
	if err != nil {
		return err
	}
	defer srv.Close()
	// The workers' Stripe call metrics join the server's, so /metrics
	// shows them.
	w, err := app.NewWorkerOn(pool, &cfg.Work, logger, srv.Registry)
	if err != nil {
		return err
	}
	defer w.Close()
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
		rc := w.Workers.Client()
		d := &demo{pool: pool, emu: emu, baseURL: baseURL, out: out, events: *events, tty: isTTY(out),
			inputEvent: cfg.Work.Meters.InputEvent, outputEvent: cfg.Work.Meters.OutputEvent, batchMax: cfg.Work.BatchMax,
			sweepGrace: cfg.Work.SweepGrace, logger: logger,
			sweep: func(ctx context.Context) error {
				_, err := rc.Insert(ctx, outbox.SweepArgs{}, nil)
				return err
			}}
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
	printAdminAccess(out, baseURL, cfg.Serve.AdminToken, generatedToken)
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// devDefaults are the demo's settings where the environment names none.
//
// The sweep keeps its production interval (10 minutes): a sweep every few
// seconds would fill River UI with completed sweep jobs in --keep-running.
// The demo asks for sweeps itself while its logs wait (demo.waitBilled),
// and a short grace lets those requeue a tenant whose report job spent its
// attempts on injected faults. Small reports (REPORT_BATCH_MAX), so the
// burst makes a hundred or so Stripe calls rather than one per tenant and
// meter: enough for the emulator's injected faults to happen and show in
// the closing table. The log is for errors only: the terminal shows
// progress instead.
var devDefaults = map[string]string{
	"SWEEP_GRACE":        "2s",
	"REPORT_BATCH_MAX":   strconv.Itoa(demoReportBatchMax),
	"REPORT_JOB_TIMEOUT": "10s",
	"LOG_LEVEL":          "error",
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
