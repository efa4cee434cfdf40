package workers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/billingtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/workers"
)

// A stream whose app server died mid-answer sends no final checkpoint: the
// workers close it once it was idle for STREAM_IDLE_TIMEOUT, as it stands.
// What it reported was billed at its checkpoints; a newer checkpoint is
// then refused. A stream still active stays open.
func TestAbandonedStreamIsClosedByTheWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t, emulator.Faults{})
	tenant := b.Tenants["cus_a"].ID
	send := func(rid string, seq int64, in int64) error {
		ev := &ingest.Event{RequestID: &rid, Timestamp: time.Now().Add(-time.Minute).UTC().Truncate(time.Microsecond), UserID: "u", ModelID: "m",
			InputTokens: in, Stream: &ingest.Checkpoint{Sequence: seq}}
		key := fmt.Sprintf("%s:%d", rid, seq)
		_, err := b.Ingest.Checkpoint(context.Background(), ingest.RecordParams{TenantID: tenant, Key: key, Fingerprint: []byte(key), Event: ev})
		return err
	}
	for _, rid := range []string{"abandoned", "active"} {
		if err := send(rid, 0, 40); err != nil {
			t.Fatal(err)
		}
	}
	// The abandoned stream's last checkpoint is two timeouts old.
	if _, err := b.Pool.Exec(context.Background(), `UPDATE usage_streams SET last_checkpoint_at = now() - interval '2 minutes'
		WHERE request_id = 'abandoned'`); err != nil {
		t.Fatal(err)
	}
	b.Start(t, workers.Config{StreamIdleTimeout: time.Minute})
	closed := func(rid string) (bool, string) {
		var by *string
		if err := b.Pool.QueryRow(context.Background(), `SELECT closed_by FROM usage_streams WHERE request_id = $1`, rid).Scan(&by); err != nil {
			t.Fatal(err)
		}
		if by == nil {
			return false, ""
		}
		return true, *by
	}
	polltest.Until(t, "the abandoned stream to be closed", 20*time.Second, func() bool { ok, _ := closed("abandoned"); return ok })
	if ok, by := closed("abandoned"); by != "idle" || !ok {
		t.Fatalf("abandoned stream closed by %q", by)
	}
	if ok, _ := closed("active"); ok {
		t.Fatal("a stream with a recent checkpoint was closed")
	}
	if err := send("abandoned", 1, 90); overage.AsError(err).Type != "stream-closed" {
		t.Fatalf("a checkpoint of the closed stream: %v", err)
	}
	if err := send("active", 1, 90); err != nil {
		t.Fatalf("a checkpoint of the open stream: %v", err)
	}
	polltest.Until(t, "every log billed", 30*time.Second, func() bool {
		var pending int
		if err := b.Pool.QueryRow(context.Background(), `SELECT count(*) FROM usage_logs WHERE billing_status <> 'billed'`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0
	})
	billingtest.RequireStripeMatchesBilled(t, b.Pool, b.Emu)
	if got := b.Emu.Applied(); got[emulator.AppliedKey{Customer: "cus_a", EventName: billingtest.InputEvent}] != 40+90 {
		t.Fatalf("Stripe holds %v, want 130 input tokens (40 of the closed stream, 90 of the open one)", got)
	}
}
