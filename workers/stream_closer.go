package workers

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/overage-billing/overage/outbox"
)

// DefaultStreamIdleTimeout is STREAM_IDLE_TIMEOUT's default.
const DefaultStreamIdleTimeout = time.Hour

// CloseIdleStreamsArgs is the periodic job that closes streams with no
// checkpoint for STREAM_IDLE_TIMEOUT.
type CloseIdleStreamsArgs struct{}

// Kind implements river.JobArgs.
func (CloseIdleStreamsArgs) Kind() string { return "overage.close_idle_streams" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (CloseIdleStreamsArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: outbox.QueueMaintenance}
}

// closeBatchSize bounds each UPDATE, so closing a backlog of abandoned
// streams never holds many row locks at once.
const closeBatchSize = 1000

// StreamCloser closes streams (ingest/stream.go) whose last checkpoint is
// older than the idle timeout, as they stand: every increase they reported
// was recorded and billed at its checkpoint, so closing bills nothing; a
// newer checkpoint is then refused as stream-closed. The UPDATE takes each
// stream's row lock, the same referee a checkpoint takes, and checks the
// age again under it, so a checkpoint committed meanwhile keeps its stream
// open.
type StreamCloser struct {
	river.WorkerDefaults[CloseIdleStreamsArgs]
	pool    *pgxpool.Pool
	timeout time.Duration
	logger  *slog.Logger
}

// Work implements river.Worker.
func (w *StreamCloser) Work(ctx context.Context, _ *river.Job[CloseIdleStreamsArgs]) error {
	total := int64(0)
	for {
		tag, err := w.pool.Exec(ctx, `UPDATE usage_streams s SET closed_at = now(), closed_by = 'idle'
			FROM (SELECT tenant_id, request_id FROM usage_streams
				WHERE closed_at IS NULL AND last_checkpoint_at < now() - make_interval(secs => $1)
				ORDER BY last_checkpoint_at LIMIT $2 FOR UPDATE SKIP LOCKED) c
			WHERE s.tenant_id = c.tenant_id AND s.request_id = c.request_id
				AND s.closed_at IS NULL AND s.last_checkpoint_at < now() - make_interval(secs => $1)`,
			w.timeout.Seconds(), closeBatchSize)
		if err != nil {
			return fmt.Errorf("close idle streams: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < closeBatchSize {
			break
		}
	}
	if total > 0 {
		w.logger.InfoContext(ctx, "idle streams closed", "count", total, "idle_timeout", w.timeout)
	}
	return nil
}

// streamCloseInterval checks often enough that a stream is closed within
// about a tenth of the timeout after it went idle, at most every second.
func streamCloseInterval(timeout time.Duration) time.Duration {
	return min(max(timeout/10, time.Second), 5*time.Minute)
}

// addStreamCloser registers the closer and returns its periodic job.
func addStreamCloser(ws *river.Workers, pool *pgxpool.Pool, cfg Config) (*river.PeriodicJob, error) {
	if err := river.AddWorkerSafely(ws, &StreamCloser{pool: pool, timeout: cfg.StreamIdleTimeout, logger: cfg.Logger}); err != nil {
		return nil, fmt.Errorf("add stream closer: %w", err)
	}
	return river.NewPeriodicJob(river.PeriodicInterval(streamCloseInterval(cfg.StreamIdleTimeout)),
		func() (river.JobArgs, *river.InsertOpts) { return CloseIdleStreamsArgs{}, nil },
		&river.PeriodicJobOpts{ID: "close_idle_streams", RunOnStart: true}), nil
}
