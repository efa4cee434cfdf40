package ingest

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pipeTx is a transaction whose BEGIN travels in the pipeline of its first
// statements and whose COMMIT travels in the pipeline of its last ones, so
// an ingest transaction costs two round trips fewer than with pgx's Begin
// and Commit (each its own round trip). It implements pgx.Tx for River's
// InsertManyTx, which runs its statement in it.
//
// PostgreSQL skips the rest of a pipeline after an error, so a failed
// statement before the COMMIT leaves the transaction open and aborted;
// Rollback then ends it. A connection released with a transaction still
// open (Rollback failed) is closed by the pool, never reused.
type pipeTx struct {
	conn *pgxpool.Conn
	done bool
}

// beginPipeTx acquires a connection; the caller's first batch must start
// with BEGIN.
func beginPipeTx(ctx context.Context, pool *pgxpool.Pool) (*pipeTx, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &pipeTx{conn: conn}, nil
}

// commitQueued marks the transaction committed by a COMMIT its caller
// queued and saw succeed.
func (t *pipeTx) commitQueued() { t.done = true }

// release ends the transaction if it is still open and gives the
// connection back.
func (t *pipeTx) release(ctx context.Context) {
	_ = t.Rollback(ctx)
	t.conn.Release()
}

func (t *pipeTx) Begin(context.Context) (pgx.Tx, error) {
	return nil, errors.New("ingest transaction: nested transactions are not supported")
}

func (t *pipeTx) Commit(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	tag, err := t.conn.Exec(ctx, "COMMIT")
	if err != nil {
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

func (t *pipeTx) Rollback(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	if _, err := t.conn.Exec(ctx, "ROLLBACK"); err != nil {
		return fmt.Errorf("roll back ingest transaction: %w", err)
	}
	return nil
}

func (t *pipeTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	return t.conn.CopyFrom(ctx, table, cols, src)
}

func (t *pipeTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

func (t *pipeTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (t *pipeTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Conn().Prepare(ctx, name, sql)
}

func (t *pipeTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, args...)
}

func (t *pipeTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

func (t *pipeTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *pipeTx) Conn() *pgx.Conn { return t.conn.Conn() }
