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
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/app"
)

const usage = `overage — bills LLM token overage to Stripe exactly once.

Usage:
  overage migrate                 apply the SQL migrations and River's
  overage serve                   run the HTTP API
  overage work                    run the River workers and the periodic sweep
  overage tenant create ...       create a tenant and print its API key once
  overage tenant list|show ...    tenants: allowance, Stripe customer, key ids (never a key), suspension
  overage tenant update ID ...    change a tenant's name, Stripe customer or allowance
  overage tenant key ...          another API key for a tenant (printed once), or revoke one at once
  overage meter ...               the meter catalog (create|list|archive): the Stripe meter each model's tokens of each kind go to
  overage dev                     everything in one process, with a demo (development build: make run)
  overage status [--tenant ID]    billed status per tenant and in total (--json for the API's object)
  overage reconcile ...           compare what the database billed with what Stripe holds
  overage review list|resolve     logs that must not be resent automatically, and an operator's decision
  overage correct ID ...          record a correction of a usage log (the corrected totals and why)
  overage retention [--dry-run]   which raw usage logs are kept, rolled up or dropped, and why (--json)
  overage version                 the module version and commit this binary was built from

Configuration comes from the environment (see README.md); flags override it.
Run "overage <command> --help" for a command's flags.
`

// devSynopsis is `overage dev`'s, in the development build and, to say
// where it is, in the production one.
const devSynopsis = "overage dev [--events N] [--keep-running] [--database-url URL]"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(exitStatus(os.Stderr, err))
}

// exitStatus prints err, if any, as one line on stderr (and a command's
// synopsis after a usage error) and returns the process's exit status:
// 0 on success or --help, 2 on a usage error, a command's own status
// (exitError), 1 otherwise.
func exitStatus(stderr io.Writer, err error) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "overage: %s\n", describe(err))
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var ue *usageError
	if errors.As(err, &ue) {
		if ue.synopsis != "" {
			fmt.Fprintf(stderr, "usage: %s\n", ue.synopsis)
		}
		if ue.command != "" {
			fmt.Fprintf(stderr, "run \"overage %s --help\" for its flags\n", ue.command)
		}
		return 2
	}
	return 1
}

// usageError is a command line the binary cannot make sense of.
type usageError struct {
	err               error
	command, synopsis string
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// exitError is an error with the exit status its command documents
// (reconcile's 1, 2 and 3).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// SQLSTATEs of a schema older than the binary.
const (
	undefinedTable  = "42P01"
	undefinedColumn = "42703"
	// A database that does not exist on a server that answers.
	invalidCatalogName = "3D000"
)

// describe renders err for a person, on one line: an application error by
// its message and the flags it names instead of its internal codes, and a
// database without our tables as the command that fixes it.
func describe(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == undefinedTable || pgErr.Code == undefinedColumn) {
		return "the database is not migrated, or is older than this binary: run `overage migrate` (" + pgErr.Message + ")"
	}
	if errors.As(err, &pgErr) && pgErr.Code == invalidCatalogName {
		// PostgreSQL answers, only the database is missing.
		return "PostgreSQL answers but " + pgErr.Message + ": create it (createdb NAME, or CREATE DATABASE), or run `overage migrate --create-database`"
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		// pgconn's message names the host, user and database, never the
		// password.
		return "cannot reach PostgreSQL (is it running, and is DATABASE_URL right?): " + connErr.Error()
	}
	msg := err.Error()
	var appErr *overage.Error
	if errors.As(err, &appErr) {
		msg = strings.Replace(msg, appErr.Error(), humanMessage(appErr), 1)
	}
	return strings.ReplaceAll(strings.TrimSpace(msg), "\n", "; ")
}

// humanMessage is an application error's message with each bad field
// named as the flag that sets it.
func humanMessage(e *overage.Error) string {
	msg := e.Message
	for _, f := range e.Fields {
		msg += fmt.Sprintf("; %s %s", flagOf(f.Field), f.Detail)
	}
	return msg
}

// flagOf names the flag of a JSON field: the CLI and the API share the
// validation, the API speaking JSON and the CLI flags.
func flagOf(field string) string {
	if field == "stripe_customer_id" {
		return "--stripe-customer"
	}
	if field == "body" {
		return "the command line"
	}
	if key, ok := strings.CutPrefix(field, "included."); ok {
		return "--included " + key + "=N:"
	}
	return "--" + strings.ReplaceAll(field, "_", "-")
}

// env is the process environment, injectable so tests run the binary's
// wiring in-process.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// run runs one command line. Its error reads as main prints it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	err := dispatch(ctx, args, env{stdout: stdout, stderr: stderr, getenv: getenv})
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return &described{err}
}

// described is an error as a person reads it (describe); errors.As still
// finds what it wraps.
type described struct{ err error }

func (d *described) Error() string { return describe(d.err) }
func (d *described) Unwrap() error { return d.err }

func dispatch(ctx context.Context, args []string, e env) error {
	stdout, stderr := e.stdout, e.stderr
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return &usageError{err: errors.New("missing command")}
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	case "--version", "-version":
		fmt.Fprintln(stdout, versionLine())
		return nil
	case "version":
		return cmdVersion(e, args[1:])
	case "migrate":
		return cmdMigrate(ctx, e, args[1:])
	case "serve":
		return cmdServe(ctx, e, args[1:])
	case "work":
		return cmdWork(ctx, e, args[1:])
	case "tenant":
		return cmdTenant(ctx, e, args[1:])
	case "meter":
		return cmdMeter(ctx, e, args[1:])
	case "dev":
		return cmdDev(ctx, e, args[1:])
	case "reconcile":
		return cmdReconcile(ctx, e, args[1:])
	case "review":
		return cmdReview(ctx, e, args[1:])
	case "status":
		return cmdStatus(ctx, e, args[1:])
	case "correct":
		return cmdCorrect(ctx, e, args[1:])
	case "retention":
		return cmdRetention(ctx, e, args[1:])
	default:
		err := fmt.Errorf("unknown command %q", args[0])
		if near := nearest(args[0], commands); near != "" {
			err = fmt.Errorf("unknown command %q (did you mean %q?)", args[0], near)
		}
		return &usageError{err: err, synopsis: `overage COMMAND [flags]; "overage --help" lists the commands`}
	}
}

// commands are the binary's commands, for "did you mean".
var commands = []string{"migrate", "serve", "work", "tenant", "meter", "dev", "reconcile", "review", "status", "correct", "retention", "version"}

// nearest is the candidate a mistyped word most likely meant: the one it
// is a prefix of, else the one within two edits; "" when none is close.
func nearest(word string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		if len(word) >= 2 && strings.HasPrefix(c, word) {
			return c
		}
		if d := editDistance(word, c); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// flags is a command's flag set with the synopsis its help and usage
// errors print.
type flags struct {
	*flag.FlagSet
	e        env
	synopsis string
	// settings are the flags that override a variable, by its name.
	settings map[string]*string
	// vars are the variables the command reads, for its help.
	vars []string
}

// newFlags returns a command's flag set. --help prints its usage to stdout;
// a bad flag is a usage error, printed once by main.
func newFlags(e env, name, synopsis string) *flags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// The flag package prints the error and the usage itself on a bad
	// flag; main prints them once instead.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flags{FlagSet: fs, e: e, synopsis: synopsis}
}

// parse parses args; after --help it prints the usage and returns
// flag.ErrHelp, which main treats as success.
func (fs *flags) parse(args []string) error {
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(fs.e.stdout, "Usage: %s\n", fs.synopsis)
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprint(fs.e.stdout, "\nFlags (each overrides its environment variable):\n")
			fs.SetOutput(fs.e.stdout)
			fs.PrintDefaults()
			fs.SetOutput(io.Discard)
		}
		if len(fs.vars) > 0 {
			fmt.Fprintf(fs.e.stdout, "\nEnvironment (README.md has each one's default and meaning):\n%s", wrap(fs.vars, "  ", 78))
		}
		return err
	}
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err != nil {
		return fs.usageError(err)
	}
	return nil
}

// wrap lists words in lines of at most width characters, each indented.
func wrap(words []string, indent string, width int) string {
	var b strings.Builder
	line := indent
	for _, w := range words {
		if line != indent && len(line)+1+len(w) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if line != indent {
			line += " "
		}
		line += w
	}
	return b.String() + line + "\n"
}

// require is a usage error naming each of the flags that was not given.
func (fs *flags) require(names ...string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var missing []string
	for _, n := range names {
		if !given[n] {
			missing = append(missing, "--"+n)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fs.usageError(fmt.Errorf("missing required flag(s) %s", strings.Join(missing, ", ")))
}

func (fs *flags) usageError(err error) error {
	synopsis, _, _ := strings.Cut(fs.synopsis, "\n")
	return &usageError{err: err, command: fs.Name(), synopsis: synopsis}
}

// loadConfig parses the command's flags, then fills parts from the
// environment: a malformed variable they read stops the command, one they
// do not read is not looked at. --database-url, which every command has,
// and the flags of fs.setting override their variables.
func loadConfig(e env, fs *flags, args []string, parts ...app.Settings) error {
	return loadConfigWith(e, fs, args, nil, parts...)
}

// loadConfigWith is loadConfig with defaults of the command's own before
// the table's (`overage dev`'s demo).
func loadConfigWith(e env, fs *flags, args []string, defaults map[string]string, parts ...app.Settings) error {
	// The default is shown as the variable's name, never its value: a
	// connection string carries a password.
	dbURL := fs.setting("database-url", "DATABASE_URL", "PostgreSQL connection string (default: $DATABASE_URL, else "+app.DefaultDatabaseURL+")")
	fs.vars = app.Names(parts...)
	if err := fs.parse(args); err != nil {
		return err
	}
	if *dbURL != "" {
		// Named as the flag it came from; the string itself is never shown
		// (it may hold a password).
		if _, err := pgconn.ParseConfig(*dbURL); err != nil {
			return fs.usageError(errors.New("--database-url: cannot parse the connection string (want postgres://USER@HOST:PORT/DATABASE or key=value pairs)"))
		}
	}
	getenv := func(name string) string {
		if v, ok := fs.settings[name]; ok && *v != "" {
			return *v
		}
		return e.getenv(name)
	}
	return app.Source{Getenv: getenv, Defaults: defaults}.Read(parts...)
}

// openTool opens what a command that queues report jobs with report's
// settings needs, and warns on stderr when a live serve or work runs with
// another REPORT_BATCH_DELAY: an operator's shell may lack the deployment's
// settings.
func openTool(ctx context.Context, e env, command string, db app.DBConfig, report app.ReportConfig) (*app.Tool, error) {
	tool, err := app.OpenTool(ctx, db)
	if err != nil {
		return nil, err
	}
	if msg := tool.BatchDelayMismatch(ctx, command, report.BatchDelay); msg != "" {
		fmt.Fprintf(e.stderr, "overage: warning: %s\n", msg)
	}
	return tool, nil
}

// setting adds a string flag that, when given, overrides the variable
// name for loadConfig.
func (fs *flags) setting(flagName, name, usage string) *string {
	if fs.settings == nil {
		fs.settings = map[string]*string{}
	}
	v := fs.String(flagName, "", usage)
	fs.settings[name] = v
	return v
}
