package workers_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/workers"
)

// Migration 0031 (meters) on a live database: usage logs written in the
// shape before it — by the previous release's serve, before and while the
// migration runs — read back, bill under the keys they always had
// (usage-log:<id>:input and :output), and keep the finance counters
// exact, beside logs of a meter that did not exist before.
func TestLogsOfBothShapesBillAcrossTheMetersMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewEmptyPool(t)
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 30); err != nil {
		t.Fatal(err)
	}
	tenant := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id) VALUES ($1, 'old', 'cus_old')`, tenant); err != nil {
		t.Fatal(err)
	}
	// What the previous release's ingest wrote: the log with its two
	// dimensions' overage, and the period total.
	var written atomic.Int64
	oldInsert := func() error {
		id, err := uuid.NewV7()
		if err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, `WITH l AS (
				INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens, period_start,
					overage_input_tokens, overage_output_tokens, billing_status)
				VALUES ($1, $2, now() - interval '1 minute', 'u', 'gpt-4o', 30, 7, date_trunc('month', now(), 'UTC'), 30, 7, 'pending'))
			INSERT INTO allowance_usage AS a (tenant_id, period_start, slot, input_tokens, output_tokens)
			VALUES ($2, date_trunc('month', now(), 'UTC'), 0, 30, 7)
			ON CONFLICT (tenant_id, period_start, slot) DO UPDATE
			SET input_tokens = a.input_tokens + 30, output_tokens = a.output_tokens + 7`, id, tenant); err != nil {
			return err
		}
		written.Add(1)
		return nil
	}
	for range 20 {
		if err := oldInsert(); err != nil {
			t.Fatal(err)
		}
	}
	// The old release keeps writing while the migration runs.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writeErr atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := oldInsert(); err != nil {
				writeErr.Store(err)
				return
			}
		}
	}()
	polltest.Until(t, "old-release writes under way", 10*time.Second, func() bool { return written.Load() >= 40 })
	if _, err := migrations.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	at := written.Load()
	polltest.Until(t, "old-release writes after the migration", 10*time.Second, func() bool { return written.Load() >= at+20 })
	close(stop)
	wg.Wait()
	if err := writeErr.Load(); err != nil {
		t.Fatalf("an old-release write failed across the migration: %v", err)
	}

	// The new release: a per-model meter, a log on it, and the workers.
	emu := emulator.New(emulator.Options{Seed: 3, Faults: emulator.Faults{LostResponseRate: 0.2}})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	sc, err := stripeclient.New(stripeclient.Config{SecretKey: "sk_test_123", APIBase: base, RateLimit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO meters (key, event_name, token_type, models) VALUES ('gpt4o_output', 'gpt4o_output_tokens', 'output', '{gpt-4o}');
		INSERT INTO meter_models (meter, token_type, pattern) VALUES ('gpt4o_output', 'output', 'gpt-4o');
		UPDATE meter_catalog SET version = version + 1`); err != nil {
		t.Fatal(err)
	}
	newID, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens, period_start,
			overage_input_tokens, overage_output_tokens, billing_status, meter_keys, meter_tokens, meter_overage)
		VALUES ($1, $2, now() - interval '1 minute', 'u', 'gpt-4o', 30, 7, date_trunc('month', now(), 'UTC'), 30, 0, 'pending',
			'{gpt4o_output}', '{7}', '{7}')`, newID, tenant); err != nil {
		t.Fatal(err)
	}
	wk, err := workers.New(pool, workers.Config{Stripe: sc, SweepInterval: 200 * time.Millisecond, SweepGrace: time.Millisecond,
		BatchDelay: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- wk.Run(wctx) }()
	t.Cleanup(func() { cancel(); <-done })

	total := written.Load() + 1
	polltest.Until(t, "every log billed", 60*time.Second, func() bool {
		var billed int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE billing_status = 'billed'`).Scan(&billed); err != nil {
			t.Fatal(err)
		}
		return billed == total
	})
	old := written.Load()
	applied := emu.Applied()
	if got := applied[emulator.AppliedKey{Customer: "cus_old", EventName: overage.DefaultMeterInputEvent}]; got != 30*total {
		t.Errorf("input applied %d, want %d", got, 30*total)
	}
	if got := applied[emulator.AppliedKey{Customer: "cus_old", EventName: overage.DefaultMeterOutputEvent}]; got != 7*old {
		t.Errorf("output applied %d, want the old logs' %d", got, 7*old)
	}
	if got := applied[emulator.AppliedKey{Customer: "cus_old", EventName: "gpt4o_output_tokens"}]; got != 7 {
		t.Errorf("gpt4o_output applied %d, want 7", got)
	}
	// Every identifier Stripe holds ends in a meter key: :input and
	// :output for the old logs' reports, :gpt4o_output for the new one's.
	for _, e := range emu.Events() {
		if e.Identifier != e.IdempotencyKey {
			t.Fatalf("event %+v: identifier and key differ", e)
		}
	}
	// The finance counters are exact for both shapes.
	var logs, oin, oout, extra int64
	if err := pool.QueryRow(ctx, `SELECT sum(usage_logs)::bigint, sum(overage_input_tokens)::bigint, sum(overage_output_tokens)::bigint,
			(SELECT coalesce(sum(overage_tokens), 0)::bigint FROM period_counters WHERE billing_status = 'billed' AND meter NOT IN ('input', 'output'))
		FROM billing_counters WHERE billing_status = 'billed'`).Scan(&logs, &oin, &oout, &extra); err != nil {
		t.Fatal(err)
	}
	if logs != total || oin != 30*total || oout != 7*old || extra != 7 {
		t.Fatalf("billed counters %d logs %d/%d, meters %d; want %d logs %d/%d, meters 7", logs, oin, oout, extra, total, 30*total, 7*old)
	}
}
