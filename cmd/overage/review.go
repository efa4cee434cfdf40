package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/user"

	"github.com/google/uuid"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/review"
)

const (
	reviewListSynopsis    = "overage review list [--tenant ID] [--json]"
	reviewResolveSynopsis = "overage review resolve ID --as billed|resend|void --reason TEXT [--by NAME] [--force]"
)

// cmdReview lists the logs that must not be resent automatically and
// records an operator's decision on one.
func cmdReview(ctx context.Context, e env, args []string) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "resolve") {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
			fmt.Fprintf(e.stdout, "Usage:\n  %s\n  %s\n", reviewListSynopsis, reviewResolveSynopsis)
			return nil
		}
		return &usageError{err: errors.New(`want "review list" or "review resolve"`), command: "review",
			synopsis: reviewListSynopsis + " | " + reviewResolveSynopsis}
	}
	if args[0] == "list" {
		return cmdReviewList(ctx, e, args[1:])
	}
	return cmdReviewResolve(ctx, e, args[1:])
}

func cmdReviewList(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "review list", reviewListSynopsis)
	tenant := fs.String("tenant", "", "only this tenant's logs")
	asJSON := fs.Bool("json", false, `print one JSON object, {"usage_logs": [...]}`)
	var db app.DBConfig
	if err := loadConfig(e, fs, args, &db); err != nil {
		return err
	}
	tenantID, err := optionalUUID("--tenant", *tenant)
	if err != nil {
		return err
	}
	pool, err := app.OpenPool(ctx, db.URL, app.ToolMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	items, err := review.List(ctx, pool, review.ListParams{TenantID: tenantID})
	if err != nil {
		return fmt.Errorf("review list: %w", err)
	}
	if *asJSON {
		// An object, as every list of the API and the CLI is.
		if items == nil {
			items = []review.Item{}
		}
		return json.NewEncoder(e.stdout).Encode(struct {
			UsageLogs []review.Item `json:"usage_logs"`
		}{items})
	}
	return review.WriteTable(e.stdout, items)
}

func cmdReviewResolve(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "review resolve", reviewResolveSynopsis)
	as := fs.String("as", "", "billed (Stripe has it), resend (send it again with the same keys) or void (never bill it)")
	reason := fs.String("reason", "", "why, for the audit trail (required)")
	by := fs.String("by", currentUser(), "who decides, for the audit trail")
	force := fs.Bool("force", false, "resend even while Stripe may still hold the old keys")
	asJSON := fs.Bool("json", false, "print JSON")
	ids, rest, err := leadingIDs(fs, args, "USAGE_LOG_ID")
	if err != nil {
		return err
	}
	id := ids[0]
	// A resend queues the tenant's report job as serve would.
	var cfg struct {
		db     app.DBConfig
		window app.WindowConfig
		report app.ReportConfig
	}
	if err := loadConfig(e, fs, rest, &cfg.db, &cfg.window, &cfg.report); err != nil {
		return err
	}
	if err := fs.require("as", "reason"); err != nil {
		return err
	}
	p := review.ResolveParams{UsageLogID: id, Action: review.Action(*as), Reason: *reason, Actor: *by, Force: *force,
		IdempotencyWindow: cfg.window.IdempotencyWindow}
	if err := p.Validate(); err != nil {
		return err
	}
	tool, err := openTool(ctx, e, "review resolve", cfg.db, cfg.report)
	if err != nil {
		return err
	}
	defer tool.Close()
	res, err := review.NewResolver(tool.Pool, app.NewInserter(tool.River, cfg.report)).Resolve(ctx, p)
	if err != nil {
		return fmt.Errorf("review resolve: %w", err)
	}
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(res)
	}
	fmt.Fprintln(e.stdout, res.String())
	return nil
}

func optionalUUID(flag, v string) (*uuid.UUID, error) {
	if v == "" {
		return nil, nil
	}
	id, err := uuid.Parse(v)
	if err != nil {
		return nil, fmt.Errorf("%s %q: not an id", flag, v)
	}
	return &id, nil
}

func currentUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return ""
}
