package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/tenants"
)

// An operator's correction is recorded once: the same command again (its
// answer lost, say) replays it under the key derived from the correction.
func TestCorrectRecordsOnceAndReplays(t *testing.T) {
	t.Parallel()
	pool, dbURL := pgtest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	tn, err := tenants.NewStore(pool).Create(context.Background(), tenants.CreateParams{Name: "acme", StripeCustomerID: "cus_correct"})
	if err != nil {
		t.Fatal(err)
	}
	var id string
	if err := pool.QueryRow(context.Background(), `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status)
		VALUES (uuidv7(), $1, now() - interval '1 minute', 'u', 'm', 100, 40, date_trunc('month', now(), 'UTC'), 100, 40, 'billed')
		RETURNING id::text`, tn.ID).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `INSERT INTO allowance_usage (tenant_id, period_start, input_tokens, output_tokens)
		VALUES ($1, date_trunc('month', now(), 'UTC'), 100, 40)`, tn.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, env, "correct", id, "--input-tokens", "60", "--output-tokens", "40"); err == nil || !strings.Contains(err.Error(), "--reason") {
		t.Fatalf("correct without a reason: %v", err)
	}
	args := []string{"correct", id, "--input-tokens", "60", "--output-tokens", "40", "--reason", "provider recount"}
	first, _, err := runCmd(t, env, args...)
	if err != nil {
		t.Fatalf("correct: %v\n%s", err, first)
	}
	again, _, err := runCmd(t, env, args...)
	if err != nil || again != first {
		t.Fatalf("correct again: %v\n%s\nwant\n%s", err, again, first)
	}
	var c struct {
		Kind     string `json:"kind"`
		Corrects string `json:"corrects"`
		Input    int64  `json:"input_tokens"`
		Overage  struct {
			Input int64 `json:"input_tokens"`
		} `json:"overage"`
		BillingStatus string `json:"billing_status"`
		CorrectedBy   string `json:"corrected_by"`
	}
	if err := json.Unmarshal([]byte(first), &c); err != nil {
		t.Fatalf("%v: %s", err, first)
	}
	if c.Kind != "correction" || c.Corrects != id || c.Input != -40 || c.Overage.Input != -40 || c.BillingStatus != "pending" || c.CorrectedBy != "admin" {
		t.Fatalf("correction %s", first)
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM usage_logs WHERE corrects = $1`, id).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d corrections (%v), want 1", n, err)
	}
}

// TestCommandsThatQueueReportsWarnOfAnotherBatchDelay: correct, review
// resolve and tenant update queue report jobs with their own
// REPORT_BATCH_DELAY; with a live work on another one, each says so on
// stderr, naming both, and says nothing beside a work with the same.
func TestCommandsThatQueueReportsWarnOfAnotherBatchDelay(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	claim, _, err := app.ClaimBatchDelay(context.Background(), dbURL, "work", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(claim.Close)
	const id = "0b0e7c2e-7d5d-4a43-9b35-6a4bb8d6b1f1" // no such log or tenant: the command fails after the check
	for _, args := range [][]string{
		{"correct", id, "--input-tokens", "1", "--output-tokens", "1", "--reason", "r"},
		{"review", "resolve", id, "--as", "void", "--reason", "r"},
		{"tenant", "update", id, "--name", "n"},
	} {
		for delay, warns := range map[string]bool{"": true, "5s": false} {
			_, stderr, _ := runCmd(t, map[string]string{"DATABASE_URL": dbURL, "REPORT_BATCH_DELAY": delay}, args...)
			warned := strings.Contains(stderr, "warning: REPORT_BATCH_DELAY disagrees: this "+args[0]) &&
				strings.Contains(stderr, "runs with 1s, but a work process with 5s")
			if warned != warns || (!warns && stderr != "") {
				t.Errorf("%v with REPORT_BATCH_DELAY=%q beside a work with 5s: stderr %q", args[:2], delay, stderr)
			}
		}
	}
}
