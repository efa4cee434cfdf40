package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/retentiontest"
	"github.com/overage-billing/overage/retention"
	"github.com/overage-billing/overage/tenants"
)

// `overage retention --dry-run` says, per partition, what would be
// dropped and why each other one is kept (and where its indexes' packing
// stands), and changes nothing (its JSON too); `overage retention` then
// drops what may go.
func TestRetentionCommandSaysWhyAndDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := pgtest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	jan := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	names := retentiontest.Replace(t, pool, jan, jan.AddDate(0, 1, 0), jan.AddDate(0, 2, 0))
	tn, err := tenants.NewStore(pool).Create(ctx, tenants.CreateParams{Name: "acme", StripeCustomerID: "cus_ret"})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct {
		at     time.Time
		status string
	}{{jan.Add(time.Hour), "billed"}, {jan.Add(2 * time.Hour), "not_billable"}, {jan.AddDate(0, 1, 1), "pending"}} {
		if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
				period_start, overage_input_tokens, overage_output_tokens, billing_status)
			VALUES ($1, $2, $3, 'u', 'm', 10, 1, date_trunc('month', $3::timestamptz, 'UTC'), 10, 1, $4)`,
			retentiontest.ID(l.at), tn.ID, l.at, l.status); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(name string) bool {
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	out, _, err := runCmd(t, env, "retention", "--dry-run")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		names[0] + "  2024-01-01  2024-02-01  2     -             would roll up and drop: older than 400d, every log final",
		names[1] + "  2024-02-01  2024-03-01  -     pending logs  kept: 1 log not final (1 pending)",
		"kept: newer than 400d",
		"dry run: nothing changed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("retention --dry-run lacks %q:\n%s", want, out)
		}
	}
	out, _, err = runCmd(t, env, "retention", "--dry-run", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var res retention.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !res.DryRun || res.Retention != "400d" || res.Partitions[0].Action != retention.ActionRollUp || res.Partitions[1].Action != retention.ActionKept {
		t.Errorf("retention --dry-run --json: %s", out)
	}
	var rollups int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_rollups`).Scan(&rollups); err != nil {
		t.Fatal(err)
	}
	if !exists(names[0]) || rollups != 0 {
		t.Fatalf("the dry runs changed something: %s there %v, %d rollups", names[0], exists(names[0]), rollups)
	}

	out, _, err = runCmd(t, env, "retention")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, names[0]+"  2024-01-01  2024-02-01  2     -             rolled up and dropped") ||
		!strings.Contains(out, "the logs recorded before 2024-02-01T00:00:00Z") || exists(names[0]) || !exists(names[1]) {
		t.Errorf("retention:\n%s\n%s there %v, %s there %v", out, names[0], exists(names[0]), names[1], exists(names[1]))
	}
	if _, _, err := runCmd(t, map[string]string{"DATABASE_URL": dbURL, "USAGE_LOG_RETENTION": "0"}, "retention"); err != nil || !exists(names[1]) {
		t.Errorf("retention with USAGE_LOG_RETENTION=0: %v", err)
	}
}
