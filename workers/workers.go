package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/alerts"
	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/meters"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/retention"
	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/usagelog"
)

// Config configures the workers. Zero values take the defaults of the
// README's configuration table.
type Config struct {
	Logger *slog.Logger
	// RiverPool is the pool of River's own statements: fetching and
	// completing jobs, leader election, the leader's periodic jobs and
	// maintenance, and the listener. Apart from the pool of the workers'
	// statements (billing, the sweep, partition maintenance), billing
	// holding all of that one cannot starve leader election, and with it
	// the periodic jobs that keep the partitions ahead. A running job
	// holds none of River's connections (River v0.51.2 works a job with
	// no connection of its own and completes it after). nil: River runs
	// on the workers' pool (tests, `overage dev`).
	RiverPool *pgxpool.Pool
	// MaintenancePool is the pool of the maintenance queue's jobs (the
	// sweep, the partitions of keys, logs and webhook events, retention,
	// idle streams): apart from the workers' pool, billing holding all of
	// that one cannot delay the partitions ingest needs ahead, and what
	// maintenance costs the database shows by its backends. nil: they run
	// on the workers' pool.
	MaintenancePool *pgxpool.Pool
	// Stripe sends meter events; required.
	Stripe stripeclient.Sender
	// MeterInputEvent and MeterOutputEvent are the meter event names.
	MeterInputEvent, MeterOutputEvent string
	// IdempotencyWindow is how long Stripe remembers a key.
	IdempotencyWindow time.Duration
	// SweepInterval is how often the sweep runs; SweepGrace is how long a
	// log may stay pending before the sweep requeues it.
	SweepInterval, SweepGrace time.Duration
	// MaxAttempts is River's attempt count per report job.
	MaxAttempts int
	// BatchDelay is how long a report gathers pending logs before it is
	// sent (REPORT_BATCH_DELAY): the period of the report jobs the sweep
	// queues. Ingest's outbox.Inserter must use the same.
	BatchDelay time.Duration
	// BatchMax is the most usage logs in one report (REPORT_BATCH_MAX).
	BatchMax int
	// RoundTries is how many rounds in a row may fail transiently before a
	// report run ends (default 3; 1 ends it on the first, as tests that
	// need a run to end on a lost answer ask).
	RoundTries int
	// ReportWorkers is how many report jobs run at once in this process.
	ReportWorkers int
	// JobTimeout bounds one report job run. A job left running by a
	// crashed process is rescued after twice this.
	JobTimeout time.Duration
	// FetchCooldown is River's minimum time between fetches of jobs.
	FetchCooldown time.Duration
	// ReapInterval is how often the webhook events' and the usage logs'
	// partitions are kept (expired ones dropped, those ahead created);
	// IdempotencyInterval, the idempotency records' (default
	// idempotency.MaintainEvery: the same ten minutes, unless a
	// development build compresses the records' time).
	ReapInterval, IdempotencyInterval time.Duration
	// StopTimeout bounds how long in-flight jobs may run after a stop
	// signal before they are cancelled and handed back to the queue.
	StopTimeout time.Duration
	// StreamIdleTimeout: a stream with no checkpoint for this long is
	// closed (STREAM_IDLE_TIMEOUT).
	StreamIdleTimeout time.Duration
	// PeriodCloseGrace is PERIOD_CLOSE_GRACE: a report of logs whose
	// period is closed when it is formed carries the formation time.
	PeriodCloseGrace time.Duration
	// Retention is USAGE_LOG_RETENTION; unlike the other fields its zero
	// is no default but the variable's own 0: every log is kept (the
	// binary passes the table's 400d). The retention run is every
	// RetentionInterval (DefaultRetentionInterval).
	Retention, RetentionInterval time.Duration
	// Alerts configures the delivery of threshold events; AlertWorkers is
	// how many run at once in this process (alerts.DefaultWorkers).
	Alerts       alerts.DeliverConfig
	AlertWorkers int
}

// Workers is a running set of River workers.
type Workers struct {
	client *river.Client[pgx.Tx]
	cfg    Config
}

// New registers the workers and periodic jobs on a River client: the
// workers' statements run on pool, River's on cfg.RiverPool.
func New(pool *pgxpool.Pool, cfg Config) (*Workers, error) {
	if cfg.Stripe == nil {
		return nil, errors.New("workers: a Stripe sender is required")
	}
	cfg = cfg.withDefaults()
	guard := usagelog.GuardFor(cfg.IdempotencyWindow)
	store := usagelog.New(pool)
	maint := cfg.MaintenancePool
	if maint == nil {
		maint = pool
	}

	ws := river.NewWorkers()
	if err := river.AddWorkerSafely(ws, &IdempotencyReaper{pool: maint, logger: cfg.Logger}); err != nil {
		return nil, fmt.Errorf("add idempotency reaper: %w", err)
	}
	if err := river.AddWorkerSafely(ws, &UsageLogPartitioner{pool: maint, logger: cfg.Logger}); err != nil {
		return nil, fmt.Errorf("add usage log partitioner: %w", err)
	}
	if err := river.AddWorkerSafely(ws, &UsageLogRetention{pool: maint, logger: cfg.Logger,
		cfg: retention.Config{Retention: cfg.Retention, CloseGrace: cfg.PeriodCloseGrace, Logger: cfg.Logger}}); err != nil {
		return nil, fmt.Errorf("add usage log retention: %w", err)
	}
	if err := river.AddWorkerSafely(ws, &ReportWorker{
		pool: pool, store: store, stripe: cfg.Stripe, guard: guard, logger: cfg.Logger, jobTimeout: cfg.JobTimeout, batchMax: cfg.BatchMax,
		closeGrace: cfg.PeriodCloseGrace,
		roundTries: cfg.RoundTries,
		inserter:   outbox.NewInserter(nil, cfg.MaxAttempts).WithBatchDelay(cfg.BatchDelay),
		meters:     meters.NewStore(pool, cfg.MeterInputEvent, cfg.MeterOutputEvent),
	}); err != nil {
		return nil, fmt.Errorf("add report worker: %w", err)
	}
	if err := river.AddWorkerSafely(ws, newSweeper(maint, cfg)); err != nil {
		return nil, fmt.Errorf("add sweeper: %w", err)
	}
	if err := AddWebhookWorkers(ws, pool, maint, cfg.Logger); err != nil {
		return nil, fmt.Errorf("add webhook workers: %w", err)
	}
	if err := river.AddWorkerSafely(ws, alerts.NewDeliverer(pool, cfg.Alerts)); err != nil {
		return nil, fmt.Errorf("add alert deliverer: %w", err)
	}
	streamCloser, err := addStreamCloser(ws, maint, cfg)
	if err != nil {
		return nil, err
	}
	riverPool := cfg.RiverPool
	if riverPool == nil {
		riverPool = pool
	}
	client, err := river.NewClient(riverpgxv5.New(riverPool), &river.Config{
		Logger:        cfg.Logger,
		Workers:       ws,
		MaxAttempts:   cfg.MaxAttempts,
		FetchCooldown: cfg.FetchCooldown,
		// A report job becomes due at the end of its batch period without
		// a notification (outbox.makeDue): poll often enough that it runs
		// then, not up to a second later.
		FetchPollInterval: max(cfg.FetchCooldown, 100*time.Millisecond),
		JobTimeout:        cfg.JobTimeout,
		// River's default rescues a job left running by a killed process
		// only after an hour; a report job is bounded by JobTimeout, so
		// anything running for twice that belongs to a dead process (or a
		// slow one, which is harmless: every send carries our key).
		RescueStuckJobsAfter: 2 * cfg.JobTimeout,
		Queues: map[string]river.QueueConfig{
			outbox.QueueReport:      {MaxWorkers: cfg.ReportWorkers},
			outbox.QueueMaintenance: {MaxWorkers: MaintenanceWorkers},
			outbox.QueueWebhooks:    WebhooksQueue(),
			// Its own queue and bounded workers: an endpoint that hangs
			// (each attempt cut at its timeout, at most PerTenant of a
			// tenant at once) delays neither billing nor other tenants.
			alerts.QueueAlerts: {MaxWorkers: cfg.AlertWorkers},
		},
		PeriodicJobs: []*river.PeriodicJob{
			river.NewPeriodicJob(river.PeriodicInterval(cfg.IdempotencyInterval),
				func() (river.JobArgs, *river.InsertOpts) { return outbox.ExpireIdempotencyKeysArgs{}, nil },
				&river.PeriodicJobOpts{ID: "expire_idempotency_keys", RunOnStart: true}),
			river.NewPeriodicJob(river.PeriodicInterval(cfg.SweepInterval),
				func() (river.JobArgs, *river.InsertOpts) {
					// One sweep per interval however many leaders come and go.
					return outbox.SweepArgs{}, &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: max(cfg.SweepInterval, time.Second)}}
				},
				&river.PeriodicJobOpts{ID: "sweep", RunOnStart: true}),
			WebhookRetentionJob(cfg.ReapInterval),
			river.NewPeriodicJob(river.PeriodicInterval(cfg.ReapInterval),
				func() (river.JobArgs, *river.InsertOpts) { return outbox.UsageLogPartitionsArgs{}, nil },
				&river.PeriodicJobOpts{ID: "usage_log_partitions", RunOnStart: true}),
			retentionJob(cfg.RetentionInterval),
			streamCloser,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	return &Workers{client: client, cfg: cfg}, nil
}

// Client is the River client, e.g. to subscribe to events in tests.
func (w *Workers) Client() *river.Client[pgx.Tx] { return w.client }

// Run works jobs until ctx is done, then stops fetching, lets in-flight
// jobs finish for up to StopTimeout and cancels the rest, which River hands
// back to the queue as retryable.
func (w *Workers) Run(ctx context.Context) error {
	if err := w.client.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return fmt.Errorf("start river: %w", err)
	}
	<-ctx.Done()
	w.cfg.Logger.Info("stopping workers: finishing in-flight jobs", "timeout", w.cfg.StopTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), w.cfg.StopTimeout)
	defer cancel()
	if err := w.client.Stop(sctx); err != nil {
		w.cfg.Logger.Warn("in-flight jobs did not finish in time; cancelling them", "err", err)
		hctx, hcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer hcancel()
		if err := w.client.StopAndCancel(hctx); err != nil {
			return fmt.Errorf("stop river: %w", err)
		}
	}
	return nil
}

// The defaults of Config's zero fields, and of the matching environment
// variables (SWEEP_INTERVAL, SWEEP_GRACE, REPORT_JOB_TIMEOUT,
// REPORT_WORKERS, REPORT_BATCH_MAX).
const (
	DefaultSweepInterval = 10 * time.Minute
	DefaultSweepGrace    = 10 * time.Minute
	DefaultJobTimeout    = time.Minute
	DefaultReportWorkers = 200
	DefaultBatchMax      = 10000
)

// MaintenanceWorkers is how many maintenance queue jobs run at once in one
// `work`; its pool (Config.MaintenancePool) needs as many connections.
const MaintenanceWorkers = 2

func (cfg Config) withDefaults() Config {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.StreamIdleTimeout, DefaultStreamIdleTimeout)
	def(&cfg.ReapInterval, 10*time.Minute)
	def(&cfg.IdempotencyInterval, idempotency.MaintainEvery)
	def(&cfg.RetentionInterval, DefaultRetentionInterval)
	def(&cfg.StopTimeout, 20*time.Second)
	def(&cfg.IdempotencyWindow, overage.StripeIdempotencyWindow)
	def(&cfg.SweepInterval, DefaultSweepInterval)
	def(&cfg.SweepGrace, DefaultSweepGrace)
	def(&cfg.JobTimeout, DefaultJobTimeout)
	def(&cfg.BatchDelay, outbox.DefaultBatchDelay)
	if cfg.RoundTries <= 0 {
		cfg.RoundTries = defaultRoundTries
	}
	if cfg.BatchMax == 0 {
		cfg.BatchMax = DefaultBatchMax
	}
	// River's default (100 ms) caps how fast freed report slots refill.
	def(&cfg.FetchCooldown, 25*time.Millisecond)
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = outbox.DefaultMaxAttempts
	}
	if cfg.ReportWorkers == 0 {
		cfg.ReportWorkers = DefaultReportWorkers
	}
	if cfg.AlertWorkers == 0 {
		cfg.AlertWorkers = alerts.DefaultWorkers
	}
	if cfg.Alerts.Logger == nil {
		cfg.Alerts.Logger = cfg.Logger
	}
	if cfg.MeterInputEvent == "" {
		cfg.MeterInputEvent = overage.DefaultMeterInputEvent
	}
	if cfg.MeterOutputEvent == "" {
		cfg.MeterOutputEvent = overage.DefaultMeterOutputEvent
	}
	return cfg
}

func newSweeper(pool *pgxpool.Pool, cfg Config) *Sweeper {
	return &Sweeper{store: usagelog.New(pool), guard: usagelog.GuardFor(cfg.IdempotencyWindow), grace: cfg.SweepGrace,
		// The sweep inserts with the River client it runs under.
		inserter: outbox.NewInserter(nil, cfg.MaxAttempts).WithBatchDelay(cfg.BatchDelay), logger: cfg.Logger}
}

// NewSweeper returns the sweep on its own, for running one by hand.
func NewSweeper(pool *pgxpool.Pool, cfg Config) *Sweeper { return newSweeper(pool, cfg.withDefaults()) }
