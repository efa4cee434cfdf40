package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/tenants"
)

func TestStatusShowsCountsReviewAndStripeMeterErrors(t *testing.T) {
	t.Parallel()
	pool, dbURL := pgtest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	tn, err := tenants.NewStore(pool).Create(context.Background(), tenants.CreateParams{Name: "acme", StripeCustomerID: "cus_status"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status, first_attempt_at, billing_message)
		SELECT uuidv7(), $1, now(), 'u', 'm', 10, 5, date_trunc('month', now()), 10, 5, s, now() - interval '2 days', 'why ' || s
		FROM unnest(ARRAY['billed', 'billed', 'pending', 'needs_review']) s`, tn.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `INSERT INTO meter_error_reports (event_seq, event_id, account, meter_id, summary, error_count, reported_at, details)
		VALUES (1, 'evt_1', 'platform', 'mtr_123', 'No customer found with id cus_gone', 3, now(), '{}')`); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, env, "status")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"acme", "cus_status", "why needs_review", "mtr_123", "No customer found with id cus_gone"} {
		if !strings.Contains(out, want) {
			t.Fatalf("status lacks %q:\n%s", want, out)
		}
	}
	out, _, err = runCmd(t, env, "status", "--json", "--tenant", tn.ID.String())
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Totals map[string]any `json:"totals"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	tot := rep.Totals
	if tot["usage_logs"] != 4.0 || tot["billed"] != 2.0 || tot["pending"] != 1.0 || tot["needs_review"] != 1.0 || tot["billed_input_tokens"] != 20.0 {
		t.Fatalf("totals %v", tot)
	}
	if _, _, err := runCmd(t, env, "status", "--tenant", "acme"); err == nil || !strings.Contains(err.Error(), "--tenant") {
		t.Fatalf("a bad --tenant: %v", err)
	}
}
