package app

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/retention"
)

// The configuration is typed per role: each type reads exactly the
// variables it holds, so a command built from the parts it uses is
// stopped by a malformed variable it reads and by no other, with no list
// of names to keep in step. Defaults come from the table of defaults.go.

// Settings is a part of the configuration that Read fills.
type Settings interface {
	read(*env)
}

// Read fills each part from getenv: every malformed variable they read is
// reported in one error of one line, each naming its variable; a variable
// none of them reads is not looked at.
func Read(getenv func(string) string, parts ...Settings) error {
	return Source{Getenv: getenv}.Read(parts...)
}

// Source is where settings come from: the environment through Getenv and,
// for a variable it leaves unset, Defaults before the table's (`overage
// dev` passes its demo's defaults this way).
type Source struct {
	Getenv   func(string) string
	Defaults map[string]string
}

// Read fills each part from s; see the package function Read.
func (s Source) Read(parts ...Settings) error {
	for name := range s.Defaults {
		defaultOf(name) // a name outside the table is a bug
	}
	e := &env{src: s, reported: map[string]bool{}}
	for _, p := range parts {
		p.read(e)
	}
	if len(e.errs) == 0 {
		return nil
	}
	// One line: the binary's errors are a single line on stderr.
	return errors.New("configuration: " + strings.Join(e.errs, "; "))
}

// Names are the variables parts read, in the order they read them, each
// once: what a command's help lists. Reading fills parts with defaults.
func Names(parts ...Settings) []string {
	var names []string
	seen := map[string]bool{}
	getenv := func(name string) string {
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
		return ""
	}
	_ = Read(getenv, parts...) // defaults only: nothing to report
	return names
}

// DBConfig is the database of every command (DATABASE_URL).
type DBConfig struct {
	URL string
}

// Read fills c from getenv (see Read).
func (c *DBConfig) Read(getenv func(string) string) error { return Read(getenv, c) }

func (c *DBConfig) read(e *env) { c.URL = e.str("DATABASE_URL") }

// LogConfig is the log's level (LOG_LEVEL).
type LogConfig struct {
	Level slog.Level
}

// Read fills c from getenv (see Read).
func (c *LogConfig) Read(getenv func(string) string) error { return Read(getenv, c) }

func (c *LogConfig) read(e *env) {
	c.Level = value(e, "LOG_LEVEL", func(v string) (slog.Level, error) {
		var l slog.Level
		if err := l.UnmarshalText([]byte(v)); err != nil {
			return l, errors.New("want debug, info, warn or error")
		}
		return l, nil
	})
}

// StripeConfig is how to reach Stripe (STRIPE_SECRET_KEY, STRIPE_API_BASE).
type StripeConfig struct {
	// SecretKey is "" when unset: each command says whether it needs one.
	SecretKey string
	APIBase   string
}

// Read fills c from getenv (see Read).
func (c *StripeConfig) Read(getenv func(string) string) error { return Read(getenv, c) }

func (c *StripeConfig) read(e *env) {
	c.SecretKey = e.str("STRIPE_SECRET_KEY")
	c.APIBase = value(e, "STRIPE_API_BASE", func(v string) (string, error) {
		if !strings.HasPrefix(v, "http://") && !strings.HasPrefix(v, "https://") {
			return "", errors.New("want an http(s) URL")
		}
		return v, nil
	})
}

// MeterConfig names the default meters' Stripe event names
// (STRIPE_METER_INPUT_EVENT, STRIPE_METER_OUTPUT_EVENT).
type MeterConfig struct {
	InputEvent, OutputEvent string
}

// Read fills c from getenv (see Read).
func (c *MeterConfig) Read(getenv func(string) string) error { return Read(getenv, c) }

func (c *MeterConfig) read(e *env) {
	c.InputEvent = e.str("STRIPE_METER_INPUT_EVENT")
	c.OutputEvent = e.str("STRIPE_METER_OUTPUT_EVENT")
}

// ReportConfig is what queuing a report job takes: River's attempts
// (REPORT_MAX_ATTEMPTS) and the batch period (REPORT_BATCH_DELAY). Every
// process that queues one reads it: serve, work and the commands that
// correct, resend or lift a suspension.
type ReportConfig struct {
	MaxAttempts int
	BatchDelay  time.Duration
}

// Read fills c from getenv (see Read).
func (c *ReportConfig) Read(getenv func(string) string) error { return Read(getenv, c) }

func (c *ReportConfig) read(e *env) {
	c.MaxAttempts = e.count("REPORT_MAX_ATTEMPTS")
	c.BatchDelay = e.duration("REPORT_BATCH_DELAY")
}

// WindowConfig is how long Stripe remembers an idempotency key
// (STRIPE_IDEMPOTENCY_WINDOW): past it nothing is resent automatically.
type WindowConfig struct {
	IdempotencyWindow time.Duration
}

// Read fills c from getenv (see Read).
func (c *WindowConfig) Read(getenv func(string) string) error { return Read(getenv, c) }

func (c *WindowConfig) read(e *env) {
	c.IdempotencyWindow = value(e, "STRIPE_IDEMPOTENCY_WINDOW", func(v string) (time.Duration, error) {
		d, err := positiveDuration(v)
		if err == nil && d > overage.StripeIdempotencyWindow {
			// Past Stripe's memory of a key a resend can bill twice.
			err = fmt.Errorf("may not exceed %s, how long Stripe remembers an idempotency key", durationText(overage.StripeIdempotencyWindow))
		}
		return d, err
	})
}

// IngestConfig is the ingest service of serve and `overage correct`.
type IngestConfig struct {
	Meters MeterConfig
	Report ReportConfig
	// Coalesce is how many ingest transactions of one tenant run at once
	// before its single events are coalesced into the next
	// (INGEST_COALESCE); 0 turns coalescing off.
	Coalesce int
	// PeriodCloseGrace is how long after a billing period ends it stays
	// open (PERIOD_CLOSE_GRACE); a closed period's logs are corrected by
	// an administrator only, and its late usage carries the time it is
	// reported.
	PeriodCloseGrace time.Duration
}

// Read fills c from getenv (see Read).
func (c *IngestConfig) Read(getenv func(string) string) error { return Read(getenv, c) }

func (c *IngestConfig) read(e *env) {
	c.Meters.read(e)
	c.Report.read(e)
	c.Coalesce = value(e, "INGEST_COALESCE", func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, errors.New("want 0 (off) or a positive integer")
		}
		return n, nil
	})
	c.PeriodCloseGrace = e.duration("PERIOD_CLOSE_GRACE")
}

// ServeConfig is `overage serve`'s.
type ServeConfig struct {
	DB     DBConfig
	Log    LogConfig
	Ingest IngestConfig
	// Stripe, with a key, lets a suspended tenant's new customer lift the
	// suspension once Stripe confirms it.
	Stripe     StripeConfig
	ListenAddr string
	// AdminToken is "" when unset: the operator endpoints are refused.
	AdminToken string
	// WebhookSecret is "" when unset: webhooks are refused.
	WebhookSecret string
	// TenantMaxInflight is how many requests of one tenant serve executes
	// at once (TENANT_MAX_INFLIGHT); beyond it 429 tenant-busy.
	TenantMaxInflight int
}

// Read fills c from getenv (see Read).
func (c *ServeConfig) Read(getenv func(string) string) error { return Read(getenv, c) }

func (c *ServeConfig) read(e *env) {
	c.DB.read(e)
	c.Log.read(e)
	c.Ingest.read(e)
	c.Stripe.read(e)
	c.ListenAddr = e.str("LISTEN_ADDR")
	c.AdminToken = e.adminToken()
	c.WebhookSecret = e.str("STRIPE_WEBHOOK_SECRET")
	c.TenantMaxInflight = e.count("TENANT_MAX_INFLIGHT")
}

// WorkConfig is `overage work`'s.
type WorkConfig struct {
	DB     DBConfig
	Log    LogConfig
	Stripe StripeConfig
	Meters MeterConfig
	Report ReportConfig
	Window WindowConfig
	// ListenAddr is WORK_LISTEN_ADDR, health and metrics; "" serves none.
	ListenAddr string
	// RateLimit is meter-event calls per second (STRIPE_RATE_LIMIT).
	RateLimit         float64
	SweepInterval     time.Duration
	SweepGrace        time.Duration
	Workers           int
	JobTimeout        time.Duration
	BatchMax          int
	StreamIdleTimeout time.Duration
	PeriodCloseGrace  time.Duration
	// Retention is USAGE_LOG_RETENTION: the daily retention run's.
	Retention time.Duration
}

// Read fills c from getenv (see Read).
func (c *WorkConfig) Read(getenv func(string) string) error { return Read(getenv, c) }

func (c *WorkConfig) read(e *env) {
	c.DB.read(e)
	c.Log.read(e)
	c.Stripe.read(e)
	c.Meters.read(e)
	c.Report.read(e)
	c.Window.read(e)
	c.ListenAddr = e.str("WORK_LISTEN_ADDR")
	c.RateLimit = float64(e.count("STRIPE_RATE_LIMIT"))
	c.SweepInterval = e.duration("SWEEP_INTERVAL")
	c.SweepGrace = e.duration("SWEEP_GRACE")
	c.Workers = e.count("REPORT_WORKERS")
	c.JobTimeout = e.duration("REPORT_JOB_TIMEOUT")
	c.BatchMax = e.count("REPORT_BATCH_MAX")
	c.StreamIdleTimeout = e.duration("STREAM_IDLE_TIMEOUT")
	c.PeriodCloseGrace = e.duration("PERIOD_CLOSE_GRACE")
	c.Retention = e.retention()
}

// RetentionConfig is `overage retention`'s: how long raw usage logs are
// kept (USAGE_LOG_RETENTION, 0 for ever) and when a period is closed
// (PERIOD_CLOSE_GRACE).
type RetentionConfig struct {
	Retention        time.Duration
	PeriodCloseGrace time.Duration
}

// Read fills c from getenv (see Read).
func (c *RetentionConfig) Read(getenv func(string) string) error { return Read(getenv, c) }

func (c *RetentionConfig) read(e *env) {
	c.Retention = e.retention()
	c.PeriodCloseGrace = e.duration("PERIOD_CLOSE_GRACE")
}

// DevConfig is `overage dev`'s: serve's and work's in one process, each
// variable read once for both.
type DevConfig struct {
	Serve ServeConfig
	Work  WorkConfig
}

func (c *DevConfig) read(e *env) {
	c.Serve.read(e)
	c.Work.read(e)
}

// env reads variables for Source.Read, recording each malformed one once.
type env struct {
	src      Source
	errs     []string
	reported map[string]bool
}

// lookup is name's text and whether the environment set it.
func (e *env) lookup(name string) (string, bool) {
	def := defaultOf(name)
	if v := e.src.Getenv(name); v != "" {
		return v, true
	}
	if v, ok := e.src.Defaults[name]; ok {
		return v, false
	}
	return def, false
}

func (e *env) fail(name, msg string) {
	if !e.reported[name] {
		e.reported[name] = true
		e.errs = append(e.errs, msg)
	}
}

// value is name's value parsed by parse. A malformed value in the
// environment is recorded, naming the variable, and the table's default
// taken instead; a malformed default is a bug of this package.
func value[T any](e *env, name string, parse func(string) (T, error)) T {
	v, set := e.lookup(name)
	x, err := parse(v)
	if err == nil {
		return x
	}
	if !set {
		panic(fmt.Sprintf("app: the default of %s, %q: %v", name, v, err))
	}
	e.fail(name, fmt.Sprintf("%s=%q: %v", name, v, err))
	x, err = parse(defaultOf(name))
	if err != nil {
		panic(fmt.Sprintf("app: the default of %s: %v", name, err))
	}
	return x
}

func (e *env) str(name string) string {
	v, _ := e.lookup(name)
	return v
}

func (e *env) duration(name string) time.Duration { return value(e, name, positiveDuration) }

// retention is USAGE_LOG_RETENTION: days ("400d"), a Go duration, or 0.
func (e *env) retention() time.Duration {
	return value(e, "USAGE_LOG_RETENTION", retention.ParseRetention)
}

func (e *env) count(name string) int {
	return value(e, name, func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return 0, errors.New("want a positive integer")
		}
		return n, nil
	})
}

// adminToken is ADMIN_TOKEN, refused when too short to be a secret; its
// error gives the length only, never the value.
func (e *env) adminToken() string {
	v, _ := e.lookup("ADMIN_TOKEN")
	if v != "" && len(v) < MinAdminTokenLen {
		e.fail("ADMIN_TOKEN", fmt.Sprintf("ADMIN_TOKEN is %d characters: want at least %d (for example: openssl rand -hex 32)", len(v), MinAdminTokenLen))
		return ""
	}
	return v
}

func positiveDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, errors.New("want a positive Go duration such as 10m or 24h")
	}
	return d, nil
}

// NewLogger is the binary's logger: JSON lines on w from level up, with
// durations as Go duration strings (logDurations).
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: logDurations}))
}
