package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/ingest"
)

const correctSynopsis = "overage correct ID --input-tokens N --output-tokens M --reason TEXT [--key KEY]"

// cmdCorrect records a correction of a usage log as an operator: the same
// transaction as POST /v1/usage-events/{id}/corrections with ADMIN_TOKEN.
// The default Idempotency-Key names the correction (log and corrected
// totals), so running the same command again after a lost answer replays
// it instead of correcting twice.
func cmdCorrect(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "correct", correctSynopsis)
	in := fs.Int64("input-tokens", -1, "the corrected input token total of the usage event (required)")
	out := fs.Int64("output-tokens", -1, "the corrected output token total of the usage event (required)")
	reason := fs.String("reason", "", "why (required)")
	key := fs.String("key", "", "Idempotency-Key (default: derived from the id and the corrected totals)")
	ids, rest, err := leadingIDs(fs, args, "USAGE_LOG_ID")
	if err != nil {
		return err
	}
	id := ids[0]
	// The ingest settings: the correction's report job takes the batch
	// period and attempts serve's would, and a closed period's correction
	// the time it is recorded.
	var cfg struct {
		db     app.DBConfig
		ingest app.IngestConfig
	}
	if err := loadConfig(e, fs, rest, &cfg.db, &cfg.ingest); err != nil {
		return err
	}
	if *in < 0 || *out < 0 || *reason == "" {
		return &usageError{err: errors.New("--input-tokens, --output-tokens (at least 0) and --reason are required"), command: "correct", synopsis: correctSynopsis}
	}
	if *key == "" {
		*key = fmt.Sprintf("correct:%s:%d:%d", id, *in, *out)
	}
	fp, err := ingest.CorrectionFingerprint(id, *in, *out, *reason)
	if err != nil {
		return err
	}
	tool, err := openTool(ctx, e, "correct", cfg.db, cfg.ingest.Report)
	if err != nil {
		return err
	}
	defer tool.Close()
	svc := app.NewIngest(tool.Pool, tool.River, &cfg.ingest)
	res, err := svc.Correct(ctx, ingest.CorrectParams{UsageLogID: id, Key: *key, Fingerprint: fp, InputTokens: *in, OutputTokens: *out, Reason: *reason})
	if err != nil {
		return fmt.Errorf("correct: %w", err)
	}
	fmt.Fprintf(e.stdout, "%s\n", res.Body)
	return nil
}
