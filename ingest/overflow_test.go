package ingest_test

import (
	"context"
	"math"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestPeriodTotalOverflowIs422: an event that would take its billing
// period's running total past bigint answers 422 naming the token fields,
// never 500; nothing is recorded, and the key stays free, so the same
// request succeeds once the total allows it.
func TestPeriodTotalOverflowIs422(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	period := func() time.Time {
		now := time.Now().UTC()
		return time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	setTotal := func(tenant uuid.UUID, slots map[int16][2]int64) {
		t.Helper()
		if _, err := b.pool.Exec(ctx, `DELETE FROM allowance_usage WHERE tenant_id = $1`, tenant); err != nil {
			t.Fatal(err)
		}
		for slot, io := range slots {
			if _, err := b.pool.Exec(ctx, `INSERT INTO allowance_usage (tenant_id, period_start, slot, input_tokens, output_tokens)
				VALUES ($1, $2, $3, $4, $5)`, tenant, period(), slot, io[0], io[1]); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		tenant func() uuid.UUID
		apiKey func() string
		slots  map[int16][2]int64
	}{
		// capped has allowance left in output tokens: its events are
		// ordered, written to slot 0, whose addition overflows.
		{"the running total's addition", func() uuid.UUID { return b.capped.ID }, func() string { return b.capped.APIKey },
			map[int16][2]int64{0: {math.MaxInt64 - 10, 0}}},
		// The total is the sum of the slot rows; reading it overflows.
		{"the sum over the slots", func() uuid.UUID { return b.alice.ID }, func() string { return b.alice.APIKey },
			map[int16][2]int64{0: {1, math.MaxInt64 / 2}, 1: {1, math.MaxInt64/2 + 2}}},
		// The total fits, and so does the row the event's slot adds to, but
		// the running total of the split would wrap.
		{"the split's running total", func() uuid.UUID { return b.alice.ID }, func() string { return b.alice.APIKey },
			map[int16][2]int64{0: {math.MaxInt64 - 50, 0}}},
	} {
		setTotal(tc.tenant(), tc.slots)
		logsBefore := b.logs(t)
		key := "overflow-" + tc.name
		r := b.post(t, tc.apiKey(), key, event(100, 100))
		if r.status != http.StatusUnprocessableEntity {
			t.Fatalf("%s: status %d, want 422: %s", tc.name, r.status, r.body)
		}
		p := r.json(t)
		var fields []string
		for _, e := range p["errors"].([]any) {
			fields = append(fields, e.(map[string]any)["field"].(string))
		}
		if p["type"] != "https://overage.dev/problems/validation-failed" || !slices.Contains(fields, "input_tokens") || !slices.Contains(fields, "output_tokens") {
			t.Errorf("%s: problem %s, want validation-failed naming the token fields", tc.name, r.body)
		}
		if n := b.logs(t); n != logsBefore {
			t.Errorf("%s: %d usage logs recorded", tc.name, n-logsBefore)
		}
		if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2`, tc.tenant(), key); n != 0 {
			t.Errorf("%s: the refused request's key was stored", tc.name)
		}
		setTotal(tc.tenant(), nil)
		if r := b.post(t, tc.apiKey(), key, event(100, 100)); r.status != http.StatusAccepted {
			t.Errorf("%s: the same request once the total allows it: %d %s", tc.name, r.status, r.body)
		}
	}
}
