package main

import (
	"context"
	"fmt"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/migrations"
)

func cmdMigrate(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "migrate", "overage migrate [--database-url URL]")
	cfg, err := loadConfig(e, fs, args, "LOG_LEVEL")
	if err != nil {
		return err
	}
	logger := app.NewLogger(e.stderr, cfg.LogLevel)
	pool, err := app.OpenPool(ctx, cfg.DatabaseURL, app.ToolMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := migrations.Migrate(ctx, pool, logger)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	fmt.Fprintf(e.stdout, "migrations applied: %d river, %d overage\n", len(res.RiverVersions), len(res.Applied))
	return nil
}
