package app

import (
	"errors"
	"fmt"
	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/workers"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config is every setting of the binary, read from the environment (see
// the README's table) and overridden by flags.
type Config struct {
	DatabaseURL             string
	ListenAddr              string
	WorkListenAddr          string
	StripeSecretKey         string
	StripeAPIBase           string
	StripeWebhookSecret     string
	StripeRateLimit         float64
	MeterInputEvent         string
	MeterOutputEvent        string
	SweepInterval           time.Duration
	SweepGrace              time.Duration
	StripeIdempotencyWindow time.Duration
	ReportMaxAttempts       int
	ReportWorkers           int
	ReportJobTimeout        time.Duration
	ReportBatchDelay        time.Duration
	ReportBatchMax          int
	AdminToken              string
	LogLevel                slog.Level
	// StreamIdleTimeout: a streamed response's checkpoints stop for this
	// long and the workers close the stream (STREAM_IDLE_TIMEOUT).
	StreamIdleTimeout time.Duration
	// IngestCoalesce is how many ingest transactions of one tenant run at
	// once before its single events are coalesced into the next
	// (INGEST_COALESCE); 0 turns coalescing off.
	IngestCoalesce int
	// TenantMaxInflight is how many requests of one tenant serve executes
	// at once (TENANT_MAX_INFLIGHT); beyond it 429 tenant-busy.
	TenantMaxInflight int
	// PeriodCloseGrace is how long after a billing period ends it stays
	// open (PERIOD_CLOSE_GRACE); a closed period's logs are corrected by
	// an administrator only.
	PeriodCloseGrace time.Duration
}

// MinAdminTokenLen is the shortest ADMIN_TOKEN accepted: the token opens
// every tenant's billing data, so it must not be guessable.
const MinAdminTokenLen = 32

// DefaultTenantMaxInflight is TENANT_MAX_INFLIGHT's default.
const DefaultTenantMaxInflight = ingest.DefaultTenantMaxInflight

// DefaultDatabaseURL is DATABASE_URL when it is unset.
const DefaultDatabaseURL = "postgres://postgres@localhost:5432/overage?sslmode=disable"

// LoadConfig reads the environment through getenv. Every malformed value is
// reported, each naming its variable.
func LoadConfig(getenv func(string) string) (*Config, error) {
	c, bad := ReadConfig(getenv)
	if err := bad.Of(); err != nil {
		return nil, err
	}
	return c, nil
}

// BadVars holds each malformed variable's error, in the order read.
type BadVars []badVar

type badVar struct {
	name string
	err  error
}

// Of reports the malformed variables among names (all of them when names
// is empty) in one error of one line, or nil.
func (b BadVars) Of(names ...string) error {
	var msgs []string
	for _, v := range b {
		if len(names) == 0 || slices.Contains(names, v.name) {
			msgs = append(msgs, v.err.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	// One line: the binary's errors are a single line on stderr.
	return errors.New("configuration: " + strings.Join(msgs, "; "))
}

// ReadConfig reads every setting, recording malformed ones instead of
// failing, so a command can judge only the settings it uses.
func ReadConfig(getenv func(string) string) (*Config, BadVars) {
	c := &Config{}
	var errs BadVars
	bad := func(name string, err error) { errs = append(errs, badVar{name, err}) }
	str := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	dur := func(name string, def time.Duration) time.Duration {
		v := getenv(name)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			bad(name, fmt.Errorf("%s=%q: want a positive Go duration such as 10m or 24h", name, v))
			return def
		}
		return d
	}
	num := func(name string, def int) int {
		v := getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			bad(name, fmt.Errorf("%s=%q: want a positive integer", name, v))
			return def
		}
		return n
	}
	c.DatabaseURL = str("DATABASE_URL", DefaultDatabaseURL)
	c.ListenAddr = str("LISTEN_ADDR", "127.0.0.1:8080")
	c.WorkListenAddr = getenv("WORK_LISTEN_ADDR")
	c.StripeSecretKey = getenv("STRIPE_SECRET_KEY")
	c.StripeAPIBase = str("STRIPE_API_BASE", "https://api.stripe.com")
	c.StripeWebhookSecret = getenv("STRIPE_WEBHOOK_SECRET")
	c.StripeRateLimit = float64(num("STRIPE_RATE_LIMIT", 1000))
	c.MeterInputEvent = str("STRIPE_METER_INPUT_EVENT", overage.DefaultMeterInputEvent)
	c.MeterOutputEvent = str("STRIPE_METER_OUTPUT_EVENT", overage.DefaultMeterOutputEvent)
	c.SweepInterval = dur("SWEEP_INTERVAL", workers.DefaultSweepInterval)
	c.SweepGrace = dur("SWEEP_GRACE", workers.DefaultSweepGrace)
	c.StripeIdempotencyWindow = dur("STRIPE_IDEMPOTENCY_WINDOW", overage.StripeIdempotencyWindow)
	if c.StripeIdempotencyWindow > overage.StripeIdempotencyWindow {
		// Past Stripe's memory of a key a resend can bill twice.
		bad("STRIPE_IDEMPOTENCY_WINDOW", fmt.Errorf("STRIPE_IDEMPOTENCY_WINDOW=%q: may not exceed %s, how long Stripe remembers an idempotency key",
			getenv("STRIPE_IDEMPOTENCY_WINDOW"), "24h"))
		c.StripeIdempotencyWindow = overage.StripeIdempotencyWindow
	}
	c.ReportMaxAttempts = num("REPORT_MAX_ATTEMPTS", outbox.DefaultMaxAttempts)
	c.ReportWorkers = num("REPORT_WORKERS", workers.DefaultReportWorkers)
	c.ReportJobTimeout = dur("REPORT_JOB_TIMEOUT", workers.DefaultJobTimeout)
	c.ReportBatchDelay = dur("REPORT_BATCH_DELAY", outbox.DefaultBatchDelay)
	c.ReportBatchMax = num("REPORT_BATCH_MAX", workers.DefaultBatchMax)
	c.AdminToken = getenv("ADMIN_TOKEN")
	if c.AdminToken != "" && len(c.AdminToken) < MinAdminTokenLen {
		// The length only: the value is a secret.
		bad("ADMIN_TOKEN", fmt.Errorf("ADMIN_TOKEN is %d characters: want at least %d (for example: openssl rand -hex 32)", len(c.AdminToken), MinAdminTokenLen))
		c.AdminToken = ""
	}
	c.TenantMaxInflight = num("TENANT_MAX_INFLIGHT", DefaultTenantMaxInflight)
	c.StreamIdleTimeout = dur("STREAM_IDLE_TIMEOUT", workers.DefaultStreamIdleTimeout)
	c.PeriodCloseGrace = dur("PERIOD_CLOSE_GRACE", ingest.DefaultPeriodCloseGrace)
	c.IngestCoalesce = ingest.DefaultGroupsInFlight
	if v := getenv("INGEST_COALESCE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			bad("INGEST_COALESCE", fmt.Errorf("INGEST_COALESCE=%q: want 0 (off) or a positive integer", v))
		} else {
			c.IngestCoalesce = n
		}
	}
	if v := getenv("LOG_LEVEL"); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			bad("LOG_LEVEL", fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", v))
		}
	}
	if !strings.HasPrefix(c.StripeAPIBase, "http://") && !strings.HasPrefix(c.StripeAPIBase, "https://") {
		bad("STRIPE_API_BASE", fmt.Errorf("STRIPE_API_BASE=%q: want an http(s) URL", c.StripeAPIBase))
	}
	return c, errs
}

// LoadConfigFromEnv reads the process environment.
func LoadConfigFromEnv() (*Config, error) { return LoadConfig(os.Getenv) }

// NewLogger is the binary's logger: JSON lines on w from level up, with
// durations as Go duration strings (logDurations).
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: logDurations}))
}
