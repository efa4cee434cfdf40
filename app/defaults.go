package app

import (
	"fmt"
	"strconv"
	"time"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/retention"
	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/workers"
)

// DefaultDatabaseURL is DATABASE_URL when it is unset.
const DefaultDatabaseURL = "postgres://postgres@localhost:5432/overage?sslmode=disable"

// MinAdminTokenLen is the shortest ADMIN_TOKEN accepted: the token opens
// every tenant's billing data, so it must not be guessable.
const MinAdminTokenLen = 32

// Var is one environment variable of the binary and its default as the
// README's configuration table writes it ("" when it has none).
type Var struct {
	Name, Default string
}

// vars is every variable the binary reads: the one place a default is
// decided. The readers of config.go take an unset variable's value from
// here. Where a package owns a value (the workers' sweep, ingest's
// coalescing) the table names the package's constant, so a package used
// with a zero config and the binary agree.
var vars = []Var{
	{"DATABASE_URL", DefaultDatabaseURL},
	{"LISTEN_ADDR", "127.0.0.1:8080"},
	{"WORK_LISTEN_ADDR", ""},
	{"STRIPE_SECRET_KEY", ""},
	{"STRIPE_API_BASE", "https://api.stripe.com"},
	{"STRIPE_WEBHOOK_SECRET", ""},
	{"STRIPE_METER_INPUT_EVENT", overage.DefaultMeterInputEvent},
	{"STRIPE_METER_OUTPUT_EVENT", overage.DefaultMeterOutputEvent},
	{"STRIPE_RATE_LIMIT", strconv.Itoa(int(stripeclient.DefaultRateLimit))},
	{"SWEEP_INTERVAL", durationText(workers.DefaultSweepInterval)},
	{"SWEEP_GRACE", durationText(workers.DefaultSweepGrace)},
	{"STRIPE_IDEMPOTENCY_WINDOW", durationText(overage.StripeIdempotencyWindow)},
	{"REPORT_MAX_ATTEMPTS", strconv.Itoa(outbox.DefaultMaxAttempts)},
	{"REPORT_BATCH_DELAY", durationText(outbox.DefaultBatchDelay)},
	{"REPORT_BATCH_MAX", strconv.Itoa(workers.DefaultBatchMax)},
	{"REPORT_WORKERS", strconv.Itoa(workers.DefaultReportWorkers)},
	{"REPORT_JOB_TIMEOUT", durationText(workers.DefaultJobTimeout)},
	{"ADMIN_TOKEN", ""},
	{"PERIOD_CLOSE_GRACE", durationText(ingest.DefaultPeriodCloseGrace)},
	{"TENANT_MAX_INFLIGHT", strconv.Itoa(ingest.DefaultTenantMaxInflight)},
	{"STREAM_IDLE_TIMEOUT", durationText(workers.DefaultStreamIdleTimeout)},
	{"INGEST_COALESCE", strconv.Itoa(ingest.DefaultGroupsInFlight)},
	{"USAGE_LOG_RETENTION", retention.FormatRetention(retention.DefaultRetention)},
	{"LOG_LEVEL", "info"},
}

// Vars returns every variable the binary reads with its default, in the
// README's order.
func Vars() []Var { return append([]Var(nil), vars...) }

// defaultOf is name's default. A name missing from the table is a bug of
// this package, caught by any test that reads the configuration.
func defaultOf(name string) string {
	for _, v := range vars {
		if v.Name == name {
			return v.Default
		}
	}
	panic(fmt.Sprintf("app: %s is not in the table of variables (defaults.go)", name))
}

// durationText writes d as the README does: 10m, 24h, 1s (time.Duration's
// String would write 10m0s).
func durationText(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}
