// Command overage is the usage-billing pipeline: `overage migrate`,
// `overage serve`, `overage work`, `overage tenant create`. Run
// `overage --help` for the list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

const usage = `overage — bills LLM token overage to Stripe exactly once.

Usage:
  overage migrate                 apply the SQL migrations and River's
  overage serve                   run the HTTP API
  overage work                    run the River workers and the periodic sweep
  overage tenant create ...       create a tenant and print its API key once
  overage dev                     everything in one process, with a demo (see README)
  overage status [--tenant ID]    billed status per tenant and in total (--json for the API's object)
  overage reconcile ...           compare what the database billed with what Stripe holds
  overage review list|resolve     logs that must not be resent automatically, and an operator's decision

Configuration comes from the environment (see README.md); flags override it.
Run "overage <command> --help" for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "overage: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		os.Exit(1)
	}
}

// env is the process environment, injectable so tests run the binary's
// wiring in-process.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	e := env{stdout: stdout, stderr: stderr, getenv: getenv}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("missing command")
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	case "migrate":
		return cmdMigrate(ctx, e, args[1:])
	case "serve":
		return cmdServe(ctx, e, args[1:])
	case "work":
		return cmdWork(ctx, e, args[1:])
	case "tenant":
		return cmdTenant(ctx, e, args[1:])
	case "dev":
		return cmdDev(ctx, e, args[1:])
	case "reconcile":
		return cmdReconcile(ctx, e, args[1:])
	case "review":
		return cmdReview(ctx, e, args[1:])
	case "status":
		return cmdStatus(ctx, e, args[1:])
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}

// newFlags returns a flag set whose --help prints usage to stdout.
func newFlags(e env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stdout, "Usage: %s\n\nFlags (each overrides its environment variable):\n", synopsis)
		fs.SetOutput(e.stdout)
		fs.PrintDefaults()
		fs.SetOutput(e.stderr)
	}
	return fs
}

// loadConfig reads the environment, then lets the common flags override it.
func loadConfig(e env, fs *flag.FlagSet, args []string) (*Config, error) {
	cfg, err := LoadConfig(e.getenv)
	if err != nil {
		return nil, err
	}
	fs.StringVar(&cfg.DatabaseURL, "database-url", cfg.DatabaseURL, "PostgreSQL connection string (DATABASE_URL)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return cfg, nil
}

func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

// Default pool sizes. Together they stay under PostgreSQL's default
// max_connections (100, 3 reserved): `work` needs more, because each of its
// report jobs commits twice while `serve` commits once per request.
const (
	serveMaxConns = 32
	workMaxConns  = 60
	toolMaxConns  = 4
)

// openPool connects to PostgreSQL with at most maxConns connections. Sizes
// and timeouts given in the URL (pool_max_conns, connect_timeout) win.
func openPool(ctx context.Context, databaseURL string, maxConns int32) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", redactParseError(err))
	}
	if !strings.Contains(databaseURL, "pool_max_conns") {
		pc.MaxConns = maxConns
	}
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return pool, nil
}

// redactParseError keeps a connection string's password out of errors.
func redactParseError(err error) error {
	return errors.New(strings.Split(err.Error(), ":")[0] + ": cannot parse the connection string")
}
