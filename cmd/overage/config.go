package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
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
}

const defaultDatabaseURL = "postgres://postgres@localhost:5432/overage?sslmode=disable"

// LoadConfig reads the environment through getenv. Every malformed value is
// reported, each naming its variable.
func LoadConfig(getenv func(string) string) (*Config, error) {
	c := &Config{}
	var errs []error
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
			errs = append(errs, fmt.Errorf("%s=%q: want a positive Go duration such as 10m or 24h", name, v))
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
			errs = append(errs, fmt.Errorf("%s=%q: want a positive integer", name, v))
			return def
		}
		return n
	}
	c.DatabaseURL = str("DATABASE_URL", defaultDatabaseURL)
	c.ListenAddr = str("LISTEN_ADDR", "127.0.0.1:8080")
	c.WorkListenAddr = getenv("WORK_LISTEN_ADDR")
	c.StripeSecretKey = getenv("STRIPE_SECRET_KEY")
	c.StripeAPIBase = str("STRIPE_API_BASE", "https://api.stripe.com")
	c.StripeWebhookSecret = getenv("STRIPE_WEBHOOK_SECRET")
	c.StripeRateLimit = float64(num("STRIPE_RATE_LIMIT", 1000))
	c.MeterInputEvent = str("STRIPE_METER_INPUT_EVENT", "llm_input_tokens")
	c.MeterOutputEvent = str("STRIPE_METER_OUTPUT_EVENT", "llm_output_tokens")
	c.SweepInterval = dur("SWEEP_INTERVAL", 10*time.Minute)
	c.SweepGrace = dur("SWEEP_GRACE", 10*time.Minute)
	c.StripeIdempotencyWindow = dur("STRIPE_IDEMPOTENCY_WINDOW", 24*time.Hour)
	c.ReportMaxAttempts = num("REPORT_MAX_ATTEMPTS", 5)
	c.ReportWorkers = num("REPORT_WORKERS", 200)
	c.ReportJobTimeout = dur("REPORT_JOB_TIMEOUT", time.Minute)
	c.ReportBatchDelay = dur("REPORT_BATCH_DELAY", time.Second)
	c.ReportBatchMax = num("REPORT_BATCH_MAX", 10000)
	c.AdminToken = getenv("ADMIN_TOKEN")
	if v := getenv("LOG_LEVEL"); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			errs = append(errs, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", v))
		}
	}
	if !strings.HasPrefix(c.StripeAPIBase, "http://") && !strings.HasPrefix(c.StripeAPIBase, "https://") {
		errs = append(errs, fmt.Errorf("STRIPE_API_BASE=%q: want an http(s) URL", c.StripeAPIBase))
	}
	if len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Error()
		}
		// One line: the binary's errors are a single line on stderr.
		return nil, errors.New("configuration: " + strings.Join(msgs, "; "))
	}
	return c, nil
}

// LoadConfigFromEnv reads the process environment.
func LoadConfigFromEnv() (*Config, error) { return LoadConfig(os.Getenv) }
