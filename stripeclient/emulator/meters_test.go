package emulator_test

import (
	"fmt"
	"testing"
	"time"

	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meter"
	"github.com/stripe/stripe-go/v79/billing/metereventsummary"

	"github.com/overage-billing/overage/internal/testkit/fakeclock"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

// Reconciliation will read meters and summaries through stripe-go, so that
// is how they are tested: field names and pagination must suit its decoder
// and iterator.
func TestMetersAndSummariesThroughStripeGo(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	h := start(t, emulator.Options{Now: clock.Now, Meters: []string{"llm_cached_tokens"}})

	day := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	send := func(customer, eventName string, ts time.Time, value int64) {
		t.Helper()
		form := meterForm(customer, fmt.Sprintf("%s-%s-%d", customer, eventName, ts.Unix()), value)
		form.Set("event_name", eventName)
		form.Set("timestamp", fmt.Sprint(ts.Unix()))
		if a := h.post(form.Get("identifier"), form); a.status != 200 {
			t.Fatalf("sending: %d %s", a.status, a.body)
		}
	}
	send("cus_a", "llm_input_tokens", day.Add(-20*time.Hour), 100) // the day before
	send("cus_a", "llm_input_tokens", day.Add(-time.Second), 1)    // last second of the day before
	send("cus_a", "llm_input_tokens", day, 10)                     // first second of the day
	send("cus_a", "llm_input_tokens", day.Add(11*time.Hour), 20)
	send("cus_b", "llm_input_tokens", day.Add(time.Hour), 1000) // another customer
	send("cus_a", "llm_output_tokens", day.Add(time.Hour), 5)   // another meter

	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(h.base),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		HTTPClient:        h.hc,
	})

	// A page size of 1 makes stripe-go follow starting_after cursors.
	meters := meter.Client{B: backend, Key: testKey}
	it := meters.List(&stripe.BillingMeterListParams{ListParams: stripe.ListParams{Limit: stripe.Int64(1)}})
	ids := map[string]string{}
	for it.Next() {
		m := it.BillingMeter()
		if m.Object != "billing.meter" || m.Status != stripe.BillingMeterStatusActive ||
			m.CustomerMapping == nil || m.CustomerMapping.EventPayloadKey != "stripe_customer_id" ||
			m.ValueSettings == nil || m.ValueSettings.EventPayloadKey != "value" ||
			m.DefaultAggregation == nil || m.DefaultAggregation.Formula != stripe.BillingMeterDefaultAggregationFormulaSum {
			t.Errorf("meter %+v", m)
		}
		ids[m.EventName] = m.ID
	}
	if err := it.Err(); err != nil {
		t.Fatalf("listing meters: %v", err)
	}
	if len(ids) != 3 || ids["llm_input_tokens"] == "" || ids["llm_output_tokens"] == "" || ids["llm_cached_tokens"] == "" {
		t.Fatalf("meters by event name: %v", ids)
	}
	if ids["llm_input_tokens"] != h.emu.MeterID("llm_input_tokens") {
		t.Errorf("MeterID disagrees with the list")
	}
	got, err := meters.Get(ids["llm_output_tokens"], nil)
	if err != nil || got.EventName != "llm_output_tokens" {
		t.Errorf("Get: %v %+v", err, got)
	}
	if _, err := meters.Get("mtr_nope", nil); err == nil {
		t.Errorf("Get of an unknown meter succeeded")
	} else if se, ok := err.(*stripe.Error); !ok || se.HTTPStatusCode != 404 || se.Code != stripe.ErrorCodeResourceMissing {
		t.Errorf("Get of an unknown meter: %v", err)
	}

	summaries := metereventsummary.Client{B: backend, Key: testKey}
	list := func(window string, start, end time.Time, limit int64) []*stripe.BillingMeterEventSummary {
		t.Helper()
		p := &stripe.BillingMeterEventSummaryListParams{
			ID:        stripe.String(ids["llm_input_tokens"]),
			Customer:  stripe.String("cus_a"),
			StartTime: stripe.Int64(start.Unix()),
			EndTime:   stripe.Int64(end.Unix()),
		}
		if window != "" {
			p.ValueGroupingWindow = stripe.String(window)
		}
		if limit > 0 {
			p.Limit = stripe.Int64(limit)
		}
		it := summaries.List(p)
		var out []*stripe.BillingMeterEventSummary
		for it.Next() {
			out = append(out, it.BillingMeterEventSummary())
		}
		if err := it.Err(); err != nil {
			t.Fatalf("listing summaries (%s): %v", window, err)
		}
		return out
	}

	byDay := list("day", day.Add(-24*time.Hour), day.Add(24*time.Hour), 1)
	if len(byDay) != 2 ||
		byDay[0].StartTime != day.Add(-24*time.Hour).Unix() || byDay[0].AggregatedValue != 101 ||
		byDay[1].StartTime != day.Unix() || byDay[1].EndTime != day.Add(24*time.Hour).Unix() || byDay[1].AggregatedValue != 30 ||
		byDay[0].Meter != ids["llm_input_tokens"] || byDay[0].Object != "billing.meter_event_summary" || byDay[0].ID == byDay[1].ID {
		t.Errorf("daily summaries: %s", dump(byDay))
	}
	whole := list("", day.Add(-24*time.Hour), day.Add(24*time.Hour), 0)
	if len(whole) != 1 || whole[0].AggregatedValue != 131 {
		t.Errorf("one window: %s", dump(whole))
	}
	hourly := list("hour", day, day.Add(12*time.Hour), 0)
	if len(hourly) != 12 || hourly[0].AggregatedValue != 10 || hourly[11].AggregatedValue != 20 {
		t.Errorf("hourly summaries: %s", dump(hourly))
	}

	// Stripe's alignment rule: a day window must start on a UTC day.
	it2 := summaries.List(&stripe.BillingMeterEventSummaryListParams{
		ID: stripe.String(ids["llm_input_tokens"]), Customer: stripe.String("cus_a"),
		StartTime: stripe.Int64(day.Add(time.Hour).Unix()), EndTime: stripe.Int64(day.Add(25 * time.Hour).Unix()),
		ValueGroupingWindow: stripe.String("day"),
	})
	for it2.Next() {
	}
	if se, ok := it2.Err().(*stripe.Error); !ok || se.HTTPStatusCode != 400 {
		t.Errorf("misaligned day window: %v", it2.Err())
	}
}

func dump(ss []*stripe.BillingMeterEventSummary) string {
	out := ""
	for _, s := range ss {
		out += fmt.Sprintf("\n  %s [%d,%d) %v", s.ID, s.StartTime, s.EndTime, s.AggregatedValue)
	}
	return out
}
