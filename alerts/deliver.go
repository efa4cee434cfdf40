package alerts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
)

// Delivery defaults (DeliverConfig's zero fields).
const (
	// DefaultTimeout bounds one delivery attempt: connecting, sending and
	// the endpoint's answer.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxAge is how long after the event a delivery is retried
	// before it is failed.
	DefaultMaxAge = 72 * time.Hour
	// DefaultBaseBackoff is the wait after the first failed attempt; each
	// later one doubles it, up to DefaultMaxBackoff, with jitter.
	DefaultBaseBackoff = 30 * time.Second
	DefaultMaxBackoff  = time.Hour
	// DefaultWorkers is how many deliveries a process makes at once (its
	// River queue's MaxWorkers); DefaultPerTenant how many of them may be
	// one tenant's, so a tenant whose endpoint hangs holds at most that
	// many.
	DefaultWorkers   = 20
	DefaultPerTenant = 2
)

// Outcomes of a delivery attempt, in alert_deliveries and the metric.
const (
	OutcomeDelivered = "delivered"
	OutcomeRetry     = "retry"
	OutcomeFailed    = "failed"
)

// DeliverConfig configures the delivery worker.
type DeliverConfig struct {
	Logger      *slog.Logger
	Timeout     time.Duration
	MaxAge      time.Duration
	BaseBackoff time.Duration
	MaxBackoff  time.Duration
	PerTenant   int
	// Metrics counts attempts by outcome; nil counts nothing.
	Metrics *Metrics
	// Transport, when set, replaces the default HTTP transport (tests).
	Transport http.RoundTripper
}

func (c DeliverConfig) withDefaults() DeliverConfig {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Timeout, DefaultTimeout)
	def(&c.MaxAge, DefaultMaxAge)
	def(&c.BaseBackoff, DefaultBaseBackoff)
	def(&c.MaxBackoff, DefaultMaxBackoff)
	if c.PerTenant <= 0 {
		c.PerTenant = DefaultPerTenant
	}
	return c
}

// Metrics are the delivery counters.
type Metrics struct {
	attempts *prometheus.CounterVec
}

// NewMetrics registers overage_alert_deliveries_total{outcome} on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "overage_alert_deliveries_total",
		Help: "Alert webhook delivery attempts by outcome: delivered (2xx), retry (failed, to be retried), failed (given up after the retry window).",
	}, []string{"outcome"})}
	for _, o := range []string{OutcomeDelivered, OutcomeRetry, OutcomeFailed} {
		m.attempts.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(m.attempts)
	}
	return m
}

func (m *Metrics) observe(outcome string) {
	if m != nil {
		m.attempts.WithLabelValues(outcome).Inc()
	}
}

// Deliverer is the River worker that POSTs events.
type Deliverer struct {
	river.WorkerDefaults[DeliverArgs]
	pool   *pgxpool.Pool
	cfg    DeliverConfig
	client *http.Client

	mu       sync.Mutex
	inFlight map[uuid.UUID]int
	retryIn  sync.Map // job id -> time.Duration, from Work to NextRetry
}

// NewDeliverer returns the delivery worker.
func NewDeliverer(pool *pgxpool.Pool, cfg DeliverConfig) *Deliverer {
	cfg = cfg.withDefaults()
	tr := cfg.Transport
	if tr == nil {
		tr = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout:   cfg.Timeout,
			ResponseHeaderTimeout: cfg.Timeout,
			MaxIdleConnsPerHost:   2,
			IdleConnTimeout:       90 * time.Second,
		}
	}
	return &Deliverer{pool: pool, cfg: cfg, inFlight: map[uuid.UUID]int{}, client: &http.Client{
		Transport: tr,
		Timeout:   cfg.Timeout,
		// A redirect is an answer that is not 2xx: retried, never followed
		// (it could point anywhere).
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// Timeout bounds a job run: the attempt and its bookkeeping.
func (d *Deliverer) Timeout(*river.Job[DeliverArgs]) time.Duration {
	return d.cfg.Timeout + 20*time.Second
}

// NextRetry is when Work said to try again: its backoff from now (River
// refuses a time already past, and would fall back to its own policy).
func (d *Deliverer) NextRetry(job *river.Job[DeliverArgs]) time.Time {
	if v, ok := d.retryIn.LoadAndDelete(job.ID); ok {
		return time.Now().Add(max(v.(time.Duration), time.Millisecond))
	}
	return time.Now().Add(d.backoff(job.Attempt))
}

// backoff is the wait after the attempt-th failed attempt: the base
// doubled per attempt, capped, with jitter (between half and all of it).
func (d *Deliverer) backoff(attempt int) time.Duration {
	b := d.cfg.BaseBackoff
	for i := 1; i < attempt && b < d.cfg.MaxBackoff; i++ {
		b *= 2
	}
	b = min(b, d.cfg.MaxBackoff)
	return b/2 + rand.N(b/2+1)
}

func (d *Deliverer) take(tenant uuid.UUID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inFlight[tenant] >= d.cfg.PerTenant {
		return false
	}
	d.inFlight[tenant]++
	return true
}

func (d *Deliverer) give(tenant uuid.UUID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inFlight[tenant]--; d.inFlight[tenant] <= 0 {
		delete(d.inFlight, tenant)
	}
}

// leased is an event under this worker's lease, with its endpoint.
type leased struct {
	Event
	attempt int
	url     *string
	secret  *string
	now     time.Time
}

// Work makes one delivery attempt of the job's event.
func (d *Deliverer) Work(ctx context.Context, job *river.Job[DeliverArgs]) error {
	var tenant uuid.UUID
	if err := d.pool.QueryRow(ctx, `SELECT tenant_id FROM alert_events WHERE id = $1`, job.Args.EventID).Scan(&tenant); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // deleted with its tenant: nothing to deliver
		}
		return fmt.Errorf("read alert event: %w", err)
	}
	if !d.take(tenant) {
		// This tenant's endpoint already holds its share of the workers.
		return river.JobSnooze(time.Second + rand.N(time.Second))
	}
	defer d.give(tenant)

	ev, err := d.lease(ctx, job.Args.EventID)
	if err != nil {
		return err
	}
	if ev == nil {
		var status string
		var until *time.Time
		if err := d.pool.QueryRow(ctx, `SELECT delivery_status, lease_until FROM alert_events WHERE id = $1`,
			job.Args.EventID).Scan(&status, &until); err != nil {
			return fmt.Errorf("read alert event: %w", err)
		}
		if status != "pending" {
			return nil // delivered, failed or without endpoint: done
		}
		// Another delivery of the event is in flight: never two at once.
		wait := time.Second
		if until != nil {
			wait = max(wait, time.Until(*until))
		}
		return river.JobSnooze(wait)
	}
	if ev.url == nil || ev.secret == nil {
		_, err := d.pool.Exec(ctx, `UPDATE alert_events SET delivery_status = 'no_endpoint', lease_until = NULL WHERE id = $1`, job.Args.EventID)
		return err
	}

	started := time.Now()
	code, sendErr := d.send(ctx, ev)
	finished := time.Now()
	outcome, errText := OutcomeDelivered, ""
	var next *time.Time
	var retryIn time.Duration
	if sendErr != nil {
		errText = sendErr.Error()
		deadline := ev.Created.Add(d.cfg.MaxAge)
		if !ev.now.Before(deadline) {
			outcome = OutcomeFailed
		} else {
			outcome = OutcomeRetry
			wait := min(d.backoff(job.Attempt), deadline.Sub(ev.now))
			t := time.Now().Add(wait)
			next, retryIn = &t, wait
		}
	}
	var status *int
	if code != 0 {
		status = &code
	}
	if err := d.finish(context.WithoutCancel(ctx), ev, started, finished, status, outcome, errText, next); err != nil {
		return err
	}
	d.cfg.Metrics.observe(outcome)
	switch outcome {
	case OutcomeDelivered:
		return nil
	case OutcomeFailed:
		d.cfg.Logger.Warn("alert delivery failed for good", "event_id", ev.ID, "tenant_id", ev.Data.TenantID, "err", sendErr)
		return river.JobCancel(sendErr)
	default:
		d.retryIn.Store(job.ID, retryIn)
		return sendErr
	}
}

// lease takes the event's delivery lease and counts the attempt; nil when
// it is no longer pending or another delivery holds the lease.
func (d *Deliverer) lease(ctx context.Context, id uuid.UUID) (*leased, error) {
	ev := &leased{}
	var rawID uuid.UUID
	var pct int16
	err := d.pool.QueryRow(ctx, `UPDATE alert_events e SET lease_until = now() + $2 * interval '1 microsecond', attempts = e.attempts + 1
		FROM tenants t
		WHERE e.id = $1 AND t.id = e.tenant_id AND e.delivery_status = 'pending'
		  AND (e.lease_until IS NULL OR e.lease_until < now())
		RETURNING e.id, e.tenant_id, e.meter, e.period_start, e.threshold_percent, e.included, e.used, e.created_at,
			e.attempts, t.alert_url, t.alert_secret, now()`,
		id, (d.cfg.Timeout+30*time.Second).Microseconds()).Scan(&rawID, &ev.Data.TenantID, &ev.Data.Meter, &ev.Data.PeriodStart,
		&pct, &ev.Data.Included, &ev.Data.Used, &ev.Created, &ev.attempt, &ev.url, &ev.secret, &ev.now)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lease alert event: %w", err)
	}
	ev.Event = fill(rawID, ev.Data, int(pct), ev.Created)
	return ev, nil
}

// fill completes an event read from its row.
func fill(id uuid.UUID, data EventData, pct int, created time.Time) Event {
	data.ThresholdPercent = pct
	data.PeriodStart = data.PeriodStart.UTC()
	return Event{ID: EventID(id), Type: EventType, Created: created.UTC().Truncate(time.Microsecond), Data: data}
}

// send POSTs the event once; a non-2xx answer is an error.
func (d *Deliverer) send(ctx context.Context, ev *leased) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	body := ev.Body()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, *ev.url, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("alert endpoint: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "overage-alerts/1")
	req.Header.Set(EventIDHeader, ev.ID)
	req.Header.Set(SignatureHeader, Sign(*ev.secret, time.Now(), body))
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("POST alert endpoint: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("alert endpoint answered %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}

// finish records the attempt and the event's new delivery state, and
// gives the lease back.
func (d *Deliverer) finish(ctx context.Context, ev *leased, started, finished time.Time, status *int, outcome, errText string, next *time.Time) error {
	var errp *string
	if errText != "" {
		if len(errText) > 500 {
			errText = errText[:500]
		}
		errp = &errText
	}
	id, _ := ParseEventID(ev.ID)
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO alert_deliveries (event_id, attempt, started_at, finished_at, status_code, outcome, error)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING`, id, ev.attempt, started, finished, status, outcome, errp)
	b.Queue(`UPDATE alert_events SET lease_until = NULL, last_error = $3, next_attempt_at = $4,
			delivery_status = CASE $2 WHEN 'delivered' THEN 'delivered' WHEN 'failed' THEN 'failed' ELSE 'pending' END,
			delivered_at = CASE WHEN $2 = 'delivered' THEN now() END,
			failed_at = CASE WHEN $2 = 'failed' THEN now() END
		WHERE id = $1`, id, outcome, errp, next)
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() })
	if err != nil {
		return fmt.Errorf("record alert delivery: %w", err)
	}
	return nil
}
