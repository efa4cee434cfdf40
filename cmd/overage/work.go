package main

import (
	"context"
	"fmt"

	"github.com/overage-billing/overage/workers"
)

func cmdWork(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "work", "overage work [--database-url URL]")
	cfg, err := loadConfig(e, fs, args)
	if err != nil {
		return err
	}
	logger := newLogger(e.stderr, cfg.LogLevel)
	pool, err := openPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	w, err := workers.New(pool, workers.Config{Logger: logger})
	if err != nil {
		return fmt.Errorf("workers: %w", err)
	}
	return w.Run(ctx)
}
