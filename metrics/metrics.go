// Package metrics defines the Prometheus metrics of overage and the small
// adapters that record them: ingest outcomes and latency, Stripe calls by
// outcome and latency, and the billing backlog read from PostgreSQL at
// scrape time.
package metrics

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/stripeclient"

	"github.com/overage-billing/overage/usagelog"
)

// Ingest outcomes, the label values of overage_ingest_requests_total.
const (
	IngestNew          = "new"
	IngestReplay       = "replay"
	IngestDuplicate    = "duplicate"
	IngestKeyReuse     = "key_reuse"
	IngestInProgress   = "in_progress"
	IngestInvalid      = "invalid"
	IngestUnauthorized = "unauthorized"
	IngestUnavailable  = "unavailable"
	IngestBusy         = "tenant_busy"
	IngestError        = "error"
)

// Ingest records POST /v1/usage-events outcomes.
type Ingest struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewIngest registers the ingest metrics on reg.
func NewIngest(reg prometheus.Registerer) *Ingest {
	m := &Ingest{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "overage_ingest_requests_total",
			Help: "Usage event requests by outcome (new, replay, duplicate, key_reuse, in_progress, invalid, unauthorized, unavailable, tenant_busy, error).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "overage_ingest_duration_seconds",
			Help:    "Time to answer a usage event request, by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"outcome"}),
	}
	reg.MustRegister(m.requests, m.duration)
	for _, o := range []string{IngestNew, IngestReplay, IngestDuplicate, IngestKeyReuse, IngestInProgress, IngestInvalid, IngestUnauthorized, IngestUnavailable, IngestBusy, IngestError} {
		m.requests.WithLabelValues(o) // present at zero, so rates work from the first scrape
	}
	return m
}

// ObserveIngest implements ingest.Observer.
func (m *Ingest) ObserveIngest(outcome string, d time.Duration) {
	m.requests.WithLabelValues(outcome).Inc()
	m.duration.WithLabelValues(outcome).Observe(d.Seconds())
}

// Stripe call outcomes, the label values of overage_stripe_calls_total.
const (
	StripeAccepted       = "accepted"
	StripeReplayed       = "replayed"
	StripeAlreadyApplied = "already_applied"
	StripeRetryable      = "retryable"
	// StripeRateLimited: Stripe answered 429; retried like retryable, and
	// counted apart so an alert can tell throttling from failure.
	StripeRateLimited = "rate_limited"
	StripePermanent   = "permanent"
	// StripeBusy: not sent, a call for the customer's meter had hung in
	// this process with others queued behind it (the job is snoozed).
	StripeBusy = "busy"
)

// Sender wraps a stripeclient.Sender, counting and timing each call.
type Sender struct {
	next     stripeclient.Sender
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// InstrumentSender registers the Stripe call metrics on reg and returns
// next wrapped.
func InstrumentSender(next stripeclient.Sender, reg prometheus.Registerer) *Sender {
	s := &Sender{
		next: next,
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "overage_stripe_calls_total",
			Help: "Meter event calls to Stripe by outcome (accepted, replayed, already_applied, retryable, rate_limited (429), permanent; busy: refused unsent, the customer's meter was busy in this process).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "overage_stripe_call_duration_seconds",
			Help:    "Meter event call latency, including the wait for the per-customer lock and the rate limit.",
			Buckets: prometheus.ExponentialBuckets(0.002, 2, 14),
		}, []string{"outcome"}),
	}
	reg.MustRegister(s.calls, s.duration)
	return s
}

// SendMeterEvent implements stripeclient.Sender.
func (s *Sender) SendMeterEvent(ctx context.Context, ev stripeclient.MeterEvent) (stripeclient.Result, error) {
	start := time.Now()
	res, err := s.next.SendMeterEvent(ctx, ev)
	outcome := StripeAccepted
	switch {
	case err != nil && stripeclient.IsBusy(err):
		outcome = StripeBusy
	case err != nil && stripeclient.IsPermanent(err):
		outcome = StripePermanent
	case err != nil && rateLimited(err):
		outcome = StripeRateLimited
	case err != nil:
		outcome = StripeRetryable
	case res.AlreadyApplied:
		outcome = StripeAlreadyApplied
	case res.Replayed:
		outcome = StripeReplayed
	}
	s.calls.WithLabelValues(outcome).Inc()
	s.duration.WithLabelValues(outcome).Observe(time.Since(start).Seconds())
	return res, err
}

func rateLimited(err error) bool {
	var se *stripeclient.Error
	return errors.As(err, &se) && se.HTTPStatus == http.StatusTooManyRequests
}

// Backlog is the billing backlog at one moment.
type Backlog struct {
	Pending, NeedsReview, Failed int64
	// OldestPending is the creation time of the oldest pending log, by the
	// database clock, or nil when nothing is pending.
	OldestPending *time.Time
	// Now is the database clock when the backlog was read.
	Now time.Time
}

// BacklogFunc reads the backlog.
type BacklogFunc func(ctx context.Context) (Backlog, error)

// BacklogCacheTTL is how long a backlog read serves the scrapes that
// follow: /metrics answers anyone who asks, and a scrape storm costs at
// most one query per BacklogCacheTTL, one at a time.
const BacklogCacheTTL = 5 * time.Second

// backlogCollector reads the backlog from PostgreSQL at a scrape, and
// serves it to the scrapes of the next BacklogCacheTTL; the age of the
// oldest pending log keeps growing meanwhile. Nothing runs between
// scrapes.
type backlogCollector struct {
	read                            BacklogFunc
	logger                          *slog.Logger
	pending, oldest, review, failed *prometheus.Desc
	up                              *prometheus.Desc
	now                             func() time.Time
	ttl                             time.Duration

	// mu is held through a read, so concurrent scrapes wait for one
	// query instead of each sending theirs.
	mu     sync.Mutex
	last   Backlog
	lastOK bool
	readAt time.Time // by now; zero before the first read
}

// RegisterBacklog registers gauges read by read at scrape time, at most
// once per BacklogCacheTTL.
func RegisterBacklog(reg prometheus.Registerer, read BacklogFunc, logger *slog.Logger) {
	reg.MustRegister(newBacklogCollector(read, logger, time.Now))
}

func newBacklogCollector(read BacklogFunc, logger *slog.Logger, now func() time.Time) *backlogCollector {
	return &backlogCollector{
		read:    read,
		logger:  logger,
		now:     now,
		ttl:     BacklogCacheTTL,
		pending: prometheus.NewDesc("overage_pending_usage_logs", "Usage logs with overage not yet accepted by Stripe.", nil, nil),
		oldest:  prometheus.NewDesc("overage_oldest_pending_age_seconds", "Age of the oldest pending usage log (0 when none).", nil, nil),
		review:  prometheus.NewDesc("overage_needs_review_usage_logs", "Usage logs past Stripe's idempotency window, waiting for an operator.", nil, nil),
		failed:  prometheus.NewDesc("overage_failed_usage_logs", "Usage logs Stripe refused permanently.", nil, nil),
		up:      prometheus.NewDesc("overage_backlog_scrape_ok", "1 when the backlog could be read from PostgreSQL (within the last "+BacklogCacheTTL.String()+").", nil, nil),
	}
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.oldest
	ch <- c.review
	ch <- c.failed
	ch <- c.up
}

// backlog is the cached read, read again once older than ttl; a failed
// read is remembered as long, so a database that does not answer is
// asked once per ttl, not once per scrape. since is how long ago it was
// read.
func (c *backlogCollector) backlog() (b Backlog, ok bool, since time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if c.readAt.IsZero() || now.Sub(c.readAt) >= c.ttl || now.Before(c.readAt) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		b, err := c.read(ctx)
		cancel()
		if err != nil && c.logger != nil && !errors.Is(err, context.Canceled) {
			c.logger.Warn("metrics: read billing backlog", "err", err)
		}
		c.last, c.lastOK, c.readAt = b, err == nil, c.now()
		now = c.readAt
	}
	return c.last, c.lastOK, now.Sub(c.readAt)
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	b, ok, since := c.backlog()
	if !ok {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	age := 0.0
	if b.OldestPending != nil {
		age = max(0, (b.Now.Sub(*b.OldestPending) + since).Seconds())
	}
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(b.Pending))
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age)
	ch <- prometheus.MustNewConstMetric(c.review, prometheus.GaugeValue, float64(b.NeedsReview))
	ch <- prometheus.MustNewConstMetric(c.failed, prometheus.GaugeValue, float64(b.Failed))
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
}

// ReadBacklog reads the backlog from the finance counters (a few rows per
// tenant) and the partial index on pending logs, so a scrape stays cheap at
// millions of logs.
func ReadBacklog(ctx context.Context, db overage.DB) (Backlog, error) {
	b, err := usagelog.ReadBacklog(ctx, db)
	return Backlog(b), err
}
