package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/retention"
)

const retentionSynopsis = "overage retention [--dry-run] [--json]"

// cmdRetention weighs every usage_logs partition, oldest first, and
// without --dry-run rolls up and drops those older than
// USAGE_LOG_RETENTION whose logs are all final and periods closed: what
// `overage work` runs daily, once, now.
func cmdRetention(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "retention", retentionSynopsis)
	dry := fs.Bool("dry-run", false, "say what would be kept, rolled up and dropped, and why; change nothing")
	asJSON := fs.Bool("json", false, "print one JSON object: {\"dry_run\", \"retention\", \"watermark\", \"partitions\": [...]}")
	var db app.DBConfig
	var cfg app.RetentionConfig
	var lc app.LogConfig
	if err := loadConfig(e, fs, args, &db, &cfg, &lc); err != nil {
		return err
	}
	tool, err := app.OpenTool(ctx, db)
	if err != nil {
		return err
	}
	defer tool.Close()
	rc := retention.Config{Retention: cfg.Retention, CloseGrace: cfg.PeriodCloseGrace}
	if lc.Level < slog.LevelInfo {
		// The answer is the table; the steps' log lines only when asked.
		rc.Logger = app.NewLogger(e.stderr, lc.Level)
	}
	res, err := retention.Run(ctx, tool.Pool, rc, *dry)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(res)
	}
	return retention.WriteText(e.stdout, res)
}
