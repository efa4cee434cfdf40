package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage/alerts"
	"github.com/overage-billing/overage/client"
)

func TestUsage(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ten := s.srv.Tenant(t, "metered", 1000, 100)
	c, err := client.New(client.Config{BaseURL: s.srv.URL, APIKey: ten.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, e := range []client.UsageEvent{
		{RequestID: "u-1", UserID: "u", ModelID: "m", InputTokens: 600, OutputTokens: 80},
		{RequestID: "u-2", UserID: "u", ModelID: "m", InputTokens: 500, OutputTokens: 30},
	} {
		if _, err := c.Record(ctx, e, nil); err != nil {
			t.Fatal(err)
		}
	}
	u, err := c.Usage(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	in, out := u.Meter("input"), u.Meter("output")
	if u.TenantID != ten.ID.String() || in == nil || out == nil {
		t.Fatalf("usage %+v", u)
	}
	if *in != (client.MeterUsage{Meter: "input", EventName: "llm_input_tokens", Included: 1000, Used: 1100, Remaining: 0, Overage: 100, Pending: 100}) ||
		*out != (client.MeterUsage{Meter: "output", EventName: "llm_output_tokens", Included: 100, Used: 110, Remaining: 0, Overage: 10, Pending: 10}) {
		t.Errorf("input %+v output %+v", *in, *out)
	}
	if !u.Period.End.After(u.Period.Start) || u.Period.Start.After(time.Now()) {
		t.Errorf("period %+v", u.Period)
	}
	earlier, err := c.Usage(ctx, &client.UsageOpts{PeriodStart: u.Period.Start.AddDate(0, -1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if m := earlier.Meter("input"); m == nil || m.Used != 0 || m.Remaining != 1000 {
		t.Errorf("an earlier period: %+v", earlier)
	}
}

// VerifyWebhook accepts what the server signs and refuses a tampered body,
// another secret, an old signature and a malformed header.
func TestVerifyWebhook(t *testing.T) {
	body := []byte(`{"id":"evt_0192","type":"usage.threshold_crossed","data":{"used":80500}}`)
	secret := "whsec_abc"
	header := alerts.Sign(secret, time.Now(), body)
	if err := client.VerifyWebhook(secret, header, body, 5*time.Minute); err != nil {
		t.Fatalf("a genuine delivery: %v", err)
	}
	old := alerts.Sign(secret, time.Now().Add(-time.Hour), body)
	for name, c := range map[string]struct {
		secret, header string
		body           []byte
	}{
		"tampered body": {secret, header, []byte(strings.Replace(string(body), "80500", "80501", 1))},
		"other secret":  {"whsec_other", header, body},
		"too old":       {secret, old, body},
		"malformed":     {secret, "v1=deadbeef", body},
		"empty":         {secret, "", body},
	} {
		if err := client.VerifyWebhook(c.secret, c.header, c.body, 5*time.Minute); !errors.Is(err, client.ErrInvalidSignature) {
			t.Errorf("%s: %v, want ErrInvalidSignature", name, err)
		}
	}
	if err := client.VerifyWebhook(secret, old, body, 0); err != nil {
		t.Errorf("tolerance 0 checks no time: %v", err)
	}
}
