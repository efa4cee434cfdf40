// Package migrations holds the project's schema as numbered, plain SQL files
// embedded in the binary, and applies them together with River's own
// migrations.
//
// Migrate is safe to run again (applied versions are recorded in
// overage_schema_migrations) and from several processes at once (a session
// advisory lock serialises them). Each file runs in its own transaction,
// unless its first line is "-- overage:no-transaction", which a file that
// must CREATE INDEX CONCURRENTLY on a large table uses.
package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/webhooks/partitions"
)

//go:embed *.sql
var files embed.FS

// lockID is the advisory lock that serialises concurrent migrators
// ("overage\x00" read as a big-endian integer).
const lockID int64 = 0x6f76657261676500

const noTransaction = "-- overage:no-transaction"

// Migration is one numbered SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// All returns the embedded migrations in version order.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration file %q: want NNNN_name.sql", e.Name())
		}
		b, err := files.ReadFile(e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("two migrations numbered %d", out[i].Version)
		}
	}
	return out, nil
}

// Result says what Migrate applied.
type Result struct {
	RiverVersions []int
	Applied       []Migration
	// Partitions are the idempotency record partitions created.
	Partitions []string
	// WebhookPartitions are the Stripe webhook event partitions created.
	WebhookPartitions []string
}

// Migrate applies River's migrations, then the project's, holding an
// advisory lock so concurrent runs wait for each other instead of racing.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (*Result, error) {
	return MigrateUpTo(ctx, pool, logger, 0)
}

// MigrateUpTo is Migrate stopping after the project's migration numbered
// version (0: all), to stage an upgrade: a test of a migration on a live
// system starts from the schema before it. The migrations numbered in also
// are applied too: the schema the code under test needs beside the one
// being staged.
func MigrateUpTo(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, version int, also ...int) (*Result, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	all, err := All()
	if err != nil {
		return nil, err
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection for migrations: %w", err)
	}
	defer conn.Release()
	// Poll with pg_try_advisory_lock instead of waiting in pg_advisory_lock:
	// a session blocked inside a statement holds a snapshot, and CREATE INDEX
	// CONCURRENTLY in the migrator that holds the lock would wait for that
	// snapshot forever — a deadlock PostgreSQL cannot see.
	for {
		var got bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", lockID).Scan(&got); err != nil {
			return nil, fmt.Errorf("take migration lock: %w", err)
		}
		if got {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for another migrator: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	defer func() {
		// A fresh context: the lock must be released even if ctx is done.
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockID)
	}()

	res := &Result{}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("river migrator: %w", err)
	}
	riverRes, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return nil, fmt.Errorf("apply river migrations: %w", err)
	}
	for _, v := range riverRes.Versions {
		res.RiverVersions = append(res.RiverVersions, v.Version)
	}

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS overage_schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return nil, fmt.Errorf("create overage_schema_migrations: %w", err)
	}
	applied := map[int]bool{}
	rows, err := conn.Query(ctx, "SELECT version FROM overage_schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read applied migrations: %w", err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}

	for _, m := range all {
		if version > 0 && m.Version > version && !slices.Contains(also, m.Version) {
			continue
		}
		if applied[m.Version] {
			continue
		}
		if err := apply(ctx, conn.Conn(), m); err != nil {
			return nil, err
		}
		logger.Info("applied migration", "version", m.Version, "name", m.Name)
		res.Applied = append(res.Applied, m)
	}
	if version > 0 && len(all) > 0 && version < all[len(all)-1].Version {
		return res, nil // staged: the partitioned table may not exist yet
	}
	// The idempotency records' partitions a week ahead, so that ingest
	// works from the first minute, before any `overage work` has run.
	if res.Partitions, err = idempotency.EnsurePartitions(ctx, pool); err != nil {
		return nil, err
	}
	// And the webhook events' months ahead, so deliveries are stored past
	// the first partition's bound.
	if res.WebhookPartitions, err = partitions.Ensure(ctx, pool); err != nil {
		return nil, err
	}
	return res, nil
}

func apply(ctx context.Context, conn *pgx.Conn, m Migration) error {
	record := func(ctx context.Context, ex interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}) error {
		_, err := ex.Exec(ctx, "INSERT INTO overage_schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
		return err
	}
	if strings.HasPrefix(m.SQL, noTransaction) {
		// Statements such as CREATE INDEX CONCURRENTLY cannot run in a
		// transaction; such a file must be written to be re-runnable (IF NOT
		// EXISTS), since a crash can leave it half applied.
		if _, err := conn.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("apply migration %04d_%s: %w", m.Version, m.Name, err)
		}
		// A CONCURRENTLY build that failed half way leaves an INVALID index
		// that IF NOT EXISTS would then keep: never record such a file.
		var invalid []string
		rows, err := conn.Query(ctx, `SELECT indexrelid::regclass::text FROM pg_index WHERE NOT indisvalid`)
		if err == nil {
			invalid, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			return fmt.Errorf("check indexes after migration %04d_%s: %w", m.Version, m.Name, err)
		}
		if len(invalid) > 0 {
			return fmt.Errorf("migration %04d_%s left invalid index(es) %v: drop them (DROP INDEX CONCURRENTLY) and run overage migrate again", m.Version, m.Name, invalid)
		}
		if err := record(ctx, conn); err != nil {
			return fmt.Errorf("record migration %04d_%s: %w", m.Version, m.Name, err)
		}
		return nil
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return err
		}
		return record(ctx, tx)
	})
	if err != nil {
		return fmt.Errorf("apply migration %04d_%s: %w", m.Version, m.Name, err)
	}
	return nil
}
