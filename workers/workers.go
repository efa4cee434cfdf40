package workers

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage/outbox"
)

// Config configures the workers.
type Config struct {
	Logger *slog.Logger
	// ReapInterval is how often expired idempotency records are deleted.
	ReapInterval time.Duration
	// StopTimeout bounds how long in-flight jobs may run after a stop
	// signal before they are cancelled and handed back to the queue.
	StopTimeout time.Duration
}

// Workers is a running set of River workers.
type Workers struct {
	client *river.Client[pgx.Tx]
	cfg    Config
}

// New registers the workers and periodic jobs on a River client.
func New(pool *pgxpool.Pool, cfg Config) (*Workers, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = 10 * time.Minute
	}
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = 20 * time.Second
	}
	ws := river.NewWorkers()
	if err := river.AddWorkerSafely(ws, &IdempotencyReaper{pool: pool, logger: cfg.Logger}); err != nil {
		return nil, fmt.Errorf("add idempotency reaper: %w", err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger:  cfg.Logger,
		Workers: ws,
		Queues: map[string]river.QueueConfig{
			outbox.QueueMaintenance: {MaxWorkers: 2},
		},
		PeriodicJobs: []*river.PeriodicJob{
			river.NewPeriodicJob(river.PeriodicInterval(cfg.ReapInterval),
				func() (river.JobArgs, *river.InsertOpts) { return outbox.ExpireIdempotencyKeysArgs{}, nil },
				&river.PeriodicJobOpts{ID: "expire_idempotency_keys", RunOnStart: true}),
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
