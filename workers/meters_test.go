package workers_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/meters"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/workers"
)

// Logs feeding several meters — per-model, cache reads, the defaults —
// under lost answers, 500s and 429s: every log ends billed and Stripe's
// sum per customer and meter event name equals the database's overage per
// meter, each report sent under usage-log:<lead>:<meter key>.
func TestEveryMeterIsBilledExactlyOnceUnderFaults(t *testing.T) {
	t.Parallel()
	b := setup(t, emulator.Faults{ServerErrorRate: 0.1, LostResponseRate: 0.2, RateLimitRate: 0.05})
	ctx := context.Background()
	store := meters.NewStore(b.Pool, overage.DefaultMeterInputEvent, overage.DefaultMeterOutputEvent)
	for _, p := range []meters.CreateParams{
		{Key: "gpt4o_input", EventName: "gpt4o_input_tokens", TokenType: overage.TokenInput, Models: []string{"gpt-4o*"}},
		{Key: "gpt4o_output", EventName: "gpt4o_output_tokens", TokenType: overage.TokenOutput, Models: []string{"gpt-4o*"}},
		{Key: "cache_reads", EventName: "cache_read_tokens", TokenType: overage.TokenCacheRead},
	} {
		if _, err := store.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	// cus_capped has 500 input tokens included on the default input meter
	// and 300 on the per-model one.
	if _, err := b.Pool.Exec(ctx, `UPDATE tenants SET included_meters = '{"gpt4o_input": 300}' WHERE stripe_customer_id = 'cus_capped'`); err != nil {
		t.Fatal(err)
	}
	stop := b.Start(t, workers.Config{})
	defer stop()

	models := []string{"gpt-4o", "gpt-4o-mini", "claude-3-5-sonnet"}
	var ids []uuid.UUID
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, customer := range []string{"cus_a", "cus_capped"} {
		for i := range 30 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				read := int64(i % 7)
				key := fmt.Sprintf("%s-%d", customer, i)
				o, err := b.Ingest.Record(ctx, ingest.RecordParams{TenantID: b.Tenants[customer].ID, Key: key, Fingerprint: []byte(key),
					Event: &ingest.Event{Timestamp: time.Now().Add(-time.Minute).UTC().Truncate(time.Microsecond), UserID: "u",
						ModelID: models[i%len(models)], InputTokens: 40, OutputTokens: 15, Parts: overage.TokenParts{CacheRead: &read}}})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids = append(ids, o.UsageLogID)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	polltest.Until(t, "every usage log billed or not billable", 60*time.Second, func() bool {
		var left int
		if err := b.Pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE billing_status NOT IN ('billed', 'not_billable')`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	})

	// The database's overage per customer and event name.
	cat, err := store.Catalog(ctx, b.Pool)
	if err != nil {
		t.Fatal(err)
	}
	want := map[emulator.AppliedKey]int64{}
	for _, id := range ids {
		l, err := b.Ingest.Get(ctx, id, nil)
		if err != nil {
			t.Fatal(err)
		}
		var customer string
		for c, tn := range b.Tenants {
			if tn.ID == l.TenantID {
				customer = c
			}
		}
		for _, ln := range l.Meters {
			if ln.Overage == 0 {
				continue
			}
			m, _ := cat.Meter(ln.Meter)
			want[emulator.AppliedKey{Customer: customer, EventName: m.EventName}] += ln.Overage
			if ln.Identifier == nil || ln.AcceptedAt == nil {
				t.Fatalf("log %s line %s billed without identifier or acceptance: %+v", id, ln.Meter, ln)
			}
			if got := fmt.Sprintf("usage-log:%s:%s", "", ln.Meter); len(*ln.Identifier) < len(got) || (*ln.Identifier)[len(*ln.Identifier)-len(ln.Meter)-1:] != ":"+ln.Meter {
				t.Fatalf("line %s identifier %q does not end in :%s", ln.Meter, *ln.Identifier, ln.Meter)
			}
		}
	}
	got := b.Emu.Applied()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("Stripe holds %d for %s/%s, the database bills %d", got[k], k.Customer, k.EventName, v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok && v != 0 {
			t.Errorf("Stripe holds %d for %s/%s, which the database does not bill", v, k.Customer, k.EventName)
		}
	}
	if want[emulator.AppliedKey{Customer: "cus_a", EventName: "cache_read_tokens"}] == 0 ||
		want[emulator.AppliedKey{Customer: "cus_a", EventName: "gpt4o_output_tokens"}] == 0 {
		t.Fatalf("the per-model and cache meters were not fed: %v", want)
	}
}
