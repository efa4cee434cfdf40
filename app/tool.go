package app

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
)

// Tool is what a CLI command that queues jobs (a correction, a resend, a
// lifted suspension) works with: a small pool and an insert-only River
// client that logs nothing, River's logs being no part of a command's
// answer.
type Tool struct {
	Pool  *pgxpool.Pool
	River *river.Client[pgx.Tx]
}

// OpenTool connects for a CLI command (ToolMaxConns).
func OpenTool(ctx context.Context, db DBConfig) (*Tool, error) {
	pool, err := OpenPool(ctx, db.URL, ToolMaxConns)
	if err != nil {
		return nil, err
	}
	rc, err := NewInsertClient(pool, nil)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &Tool{Pool: pool, River: rc}, nil
}

// BatchDelayMismatch says, for a command named command that queues report
// jobs with delay, whether a live serve or work runs with another
// REPORT_BATCH_DELAY (see batchdelay.go): "" when none does or the check
// cannot be made, which the command's own queries will report.
func (t *Tool) BatchDelayMismatch(ctx context.Context, command string, delay time.Duration) string {
	others, err := otherDelays(ctx, t.Pool, delay)
	if err != nil {
		return ""
	}
	return BatchDelayMismatch(command, delay, others)
}

// Close releases the pool.
func (t *Tool) Close() { t.Pool.Close() }
