package alerts_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/alerts"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/meters"
	"github.com/overage-billing/overage/tenants"
)

// A meter of the catalog other than the defaults has its own allowance,
// thresholds and line in GET /v1/usage, keyed by its meter key.
func TestPerModelMeterUsageAndThresholds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, worldOpts{in: 100, out: 100, alertAt: []int{80}})
	if _, err := meters.NewStore(w.pool, "llm_input_tokens", "llm_output_tokens").Create(ctx, meters.CreateParams{
		Key: "gpt4o_input", EventName: "gpt4o_input_tokens", TokenType: overage.TokenInput, Models: []string{"gpt-4o"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := tenants.NewStore(w.pool).Update(ctx, w.tenant, tenants.UpdateParams{Included: map[string]int64{"gpt4o_input": 1000}}); err != nil {
		t.Fatal(err)
	}
	record := func(model string, in int64) {
		t.Helper()
		key := uuid.NewString()
		if _, err := w.svc.Record(ctx, ingest.RecordParams{TenantID: w.tenant, Key: key, Fingerprint: []byte(key),
			Event: &ingest.Event{RequestID: rid(), Timestamp: time.Now().UTC().Truncate(time.Microsecond), UserID: "u", ModelID: model, InputTokens: in, OutputTokens: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	record("gpt-4o", 700) // 70% of the gpt-4o meter; nothing on input
	record("gpt-4o", 200) // 90%: across 80%
	record("gpt-4o", 300) // 1,200: 200 of overage
	record("other", 50)   // 50% of input
	ev := w.events(t)
	if len(ev) != 1 || ev[0].meter != "gpt4o_input" || ev[0].pct != 80 || ev[0].used != 900 {
		t.Fatalf("events %+v, want gpt4o_input at 80 with 900 used", ev)
	}
	var got alerts.PeriodUsage
	if code := get(t, handler(w), "/v1/usage", w.key, &got); code != http.StatusOK {
		t.Fatalf("GET /v1/usage: %d", code)
	}
	want := []alerts.MeterUsage{
		{Meter: "input", EventName: "llm_input_tokens", Included: 100, Used: 50, Remaining: 50},
		{Meter: "output", EventName: "llm_output_tokens", Included: 100, Used: 4, Remaining: 96},
		{Meter: "gpt4o_input", EventName: "gpt4o_input_tokens", Included: 1000, Used: 1200, Overage: 200, Pending: 200},
	}
	if len(got.Meters) != len(want) {
		t.Fatalf("meters %+v", got.Meters)
	}
	for i := range want {
		if got.Meters[i] != want[i] {
			t.Errorf("meter %d: got %+v, want %+v", i, got.Meters[i], want[i])
		}
	}
}
