package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/retentiontest"
	"github.com/overage-billing/overage/retention"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/usagelog"
	"github.com/overage-billing/overage/workers"
)

// `overage work` runs retention at start and then every interval: a past
// partition whose logs are billed is rolled up and dropped by the first
// run, one made old afterwards by the next, with no command.
func TestWorkRunsRetentionPeriodically(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, emulator.Faults{})
	jan := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	first := retentiontest.Replace(t, b.Pool, jan, jan.AddDate(0, 1, 0))[0]
	tenant := b.Tenants["cus_a"].ID
	seedBilledLog(t, b.Pool, tenant, jan.Add(time.Hour))
	b.Start(t, workers.Config{Retention: retention.DefaultRetention, RetentionInterval: 2 * time.Second})
	gone := func(name string) func() bool {
		return func() bool {
			var dropped bool
			if err := b.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NULL AND EXISTS (
				SELECT FROM usage_rollup_partitions WHERE partition = $1 AND dropped_at IS NOT NULL)`, name).Scan(&dropped); err != nil {
				t.Fatal(err)
			}
			return dropped
		}
	}
	polltest.Until(t, first+" rolled up and dropped at start", 30*time.Second, gone(first))

	second, err := usagelog.AddPartition(ctx, b.Pool, jan.AddDate(0, 1, 0), jan.AddDate(0, 2, 0))
	if err != nil {
		t.Fatal(err)
	}
	seedBilledLog(t, b.Pool, tenant, jan.AddDate(0, 1, 0).Add(time.Hour))
	polltest.Until(t, second+" rolled up and dropped by a later run", 30*time.Second, gone(second))
	var logs int64
	if err := b.Pool.QueryRow(ctx, `SELECT sum(logs) FROM usage_rollups WHERE meter = 'input'`).Scan(&logs); err != nil {
		t.Fatal(err)
	}
	if logs != 2 {
		t.Fatalf("the rollups count %d logs, want 2", logs)
	}
}

// `overage work`'s retention packs a month it keeps (USAGE_LOG_RETENTION
// 0) once the month is over and billed: the partition is recorded in
// usage_log_packs and its primary key is rebuilt at fillfactor 100.
func TestWorkPacksAMonthItKeeps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, emulator.Faults{})
	jan := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	month := retentiontest.Replace(t, b.Pool, jan, jan.AddDate(0, 1, 0))[0]
	seedBilledLog(t, b.Pool, b.Tenants["cus_a"].ID, jan.Add(time.Hour))
	b.Start(t, workers.Config{Retention: 0, RetentionInterval: time.Hour})
	polltest.Until(t, month+" packed at start", 30*time.Second, func() bool {
		var packed bool
		if err := b.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM usage_log_packs WHERE partition = $1)
				AND (SELECT reloptions FROM pg_class WHERE relname = $1 || '_pkey') = ARRAY['fillfactor=100']`, month).Scan(&packed); err != nil {
			t.Fatal(err)
		}
		return packed
	})
}

// seedBilledLog writes a billed log of tenant minted and used at at.
func seedBilledLog(t *testing.T, pool *pgxpool.Pool, tenant uuid.UUID, at time.Time) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status)
		VALUES ($1, $2, $3, 'u', 'm', 10, 1, date_trunc('month', $3::timestamptz, 'UTC'), 10, 1, 'billed')`,
		retentiontest.ID(at), tenant, at); err != nil {
		t.Fatal(err)
	}
}
