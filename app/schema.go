package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/overage-billing/overage/migrations"
)

// ErrNotMigrated is the error of CheckSchema when the database lacks a
// migration this binary carries.
var ErrNotMigrated = errors.New("the database is not migrated, or is older than this binary: run `overage migrate`")

// CheckSchema returns an error wrapping ErrNotMigrated, naming what is
// missing, unless every migration this binary carries (River's and the
// project's) is applied. A long-running command calls it before it starts,
// so a process on an unmigrated database exits instead of looking healthy
// and failing every request. A database newer than the binary passes.
func CheckSchema(ctx context.Context, pool *pgxpool.Pool) error {
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return fmt.Errorf("check schema: river migrator: %w", err)
	}
	res, err := migrator.Validate(ctx, nil)
	if err != nil {
		return fmt.Errorf("check schema: river's migrations: %w", err)
	}
	if !res.OK {
		return fmt.Errorf("%w (River: %v)", ErrNotMigrated, res.Messages)
	}
	all, err := migrations.All()
	if err != nil {
		return fmt.Errorf("check schema: %w", err)
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('overage_schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("check schema: %w", err)
	}
	if !exists {
		return fmt.Errorf("%w (no overage_schema_migrations table)", ErrNotMigrated)
	}
	rows, err := pool.Query(ctx, `SELECT version FROM overage_schema_migrations`)
	if err != nil {
		return fmt.Errorf("check schema: read applied migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("check schema: read applied migrations: %w", err)
	}
	applied := make(map[int]bool, len(versions))
	for _, v := range versions {
		applied[int(v)] = true
	}
	var missing []int
	for _, m := range all {
		if !applied[m.Version] {
			missing = append(missing, m.Version)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w (unapplied migrations: %v)", ErrNotMigrated, missing)
	}
	return nil
}
