package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/tenants"
)

func TestReviewListAndResolveAreAudited(t *testing.T) {
	t.Parallel()
	pool, dbURL := pgtest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	tn, err := tenants.NewStore(pool).Create(context.Background(), tenants.CreateParams{Name: "acme", StripeCustomerID: "cus_review"})
	if err != nil {
		t.Fatal(err)
	}
	var id string
	if err := pool.QueryRow(context.Background(), `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status, first_attempt_at, billing_message)
		VALUES (uuidv7(), $1, now() - interval '2 days', 'u', 'm', 10, 0, date_trunc('month', now()), 10, 0, 'needs_review',
			now() - interval '2 days', 'first sent two days ago') RETURNING id::text`, tn.ID).Scan(&id); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, env, "review", "list")
	if err != nil || !strings.Contains(out, id) || !strings.Contains(out, "first sent two days ago") {
		t.Fatalf("review list: %v\n%s", err, out)
	}
	// --json is one object, as every list is.
	out, _, err = runCmd(t, env, "review", "list", "--json")
	var listed struct {
		UsageLogs []struct {
			UsageLogID string `json:"usage_log_id"`
		} `json:"usage_logs"`
	}
	if err != nil || json.Unmarshal([]byte(out), &listed) != nil || len(listed.UsageLogs) != 1 || listed.UsageLogs[0].UsageLogID != id {
		t.Fatalf("review list --json: %v\n%s", err, out)
	}
	if _, _, err := runCmd(t, env, "review", "resolve", id, "--as", "void"); err == nil || !strings.Contains(err.Error(), "--reason") {
		t.Fatalf("resolve without a reason: %v", err)
	}
	out, _, err = runCmd(t, env, "review", "resolve", id, "--as", "void", "--reason", "customer churned before billing", "--by", "alice")
	if err != nil {
		t.Fatalf("resolve: %v\n%s", err, out)
	}
	var actor, reason, prev string
	if err := pool.QueryRow(context.Background(), "SELECT actor, reason, previous_status FROM review_actions WHERE usage_log_id = $1", id).Scan(&actor, &reason, &prev); err != nil {
		t.Fatal(err)
	}
	if actor != "alice" || reason != "customer churned before billing" || prev != "needs_review" {
		t.Fatalf("audit row: %s %q %s", actor, reason, prev)
	}
	if out, _, _ := runCmd(t, env, "review", "list"); strings.Contains(out, id) {
		t.Fatalf("a resolved log is still listed:\n%s", out)
	}
	if out, _, err := runCmd(t, env, "review", "list", "--json"); err != nil || out != "{\"usage_logs\":[]}\n" {
		t.Fatalf("review list --json of nothing: %v %q", err, out)
	}
}
