package app_test

import (
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage/app"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestConfigRefusesUnsafeLimits: a window Stripe does not keep, an
// admin token too short to be a secret and a tenant limit that is not a
// positive integer are startup errors naming their variable, and the
// token's value is never in the message.
func TestConfigRefusesUnsafeLimits(t *testing.T) {
	t.Parallel()
	const shortToken = "short-admin-token-31-characters"
	if len(shortToken) != app.MinAdminTokenLen-1 {
		t.Fatalf("test token is %d characters", len(shortToken))
	}
	for _, tc := range []struct {
		name, value string
	}{
		{"STRIPE_IDEMPOTENCY_WINDOW", "25h"},
		{"STRIPE_IDEMPOTENCY_WINDOW", "24h0m1s"},
		{"ADMIN_TOKEN", shortToken},
		{"ADMIN_TOKEN", "q7Zk"},
		{"TENANT_MAX_INFLIGHT", "0"},
		{"TENANT_MAX_INFLIGHT", "eight"},
		{"PERIOD_CLOSE_GRACE", "an hour"},
		{"PERIOD_CLOSE_GRACE", "-1h"},
	} {
		_, err := app.LoadConfig(envOf(map[string]string{tc.name: tc.value}))
		if err == nil || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s=%q: error %v, want one naming %s", tc.name, tc.value, err, tc.name)
			continue
		}
		if tc.name == "ADMIN_TOKEN" && strings.Contains(err.Error(), tc.value) {
			t.Errorf("ADMIN_TOKEN's value in the error: %v", err)
		}
	}
	for _, tc := range []struct {
		env  map[string]string
		want func(*app.Config) bool
	}{
		{map[string]string{"STRIPE_IDEMPOTENCY_WINDOW": "24h"}, func(c *app.Config) bool { return c.StripeIdempotencyWindow == 24*time.Hour }},
		{map[string]string{"STRIPE_IDEMPOTENCY_WINDOW": "1h"}, func(c *app.Config) bool { return c.StripeIdempotencyWindow == time.Hour }},
		{map[string]string{"ADMIN_TOKEN": shortToken + "x"}, func(c *app.Config) bool { return c.AdminToken == shortToken+"x" }},
		{map[string]string{}, func(c *app.Config) bool {
			return c.AdminToken == "" && c.TenantMaxInflight == app.DefaultTenantMaxInflight && c.PeriodCloseGrace == time.Hour
		}},
		{map[string]string{"PERIOD_CLOSE_GRACE": "30m"}, func(c *app.Config) bool { return c.PeriodCloseGrace == 30*time.Minute }},
		{map[string]string{"TENANT_MAX_INFLIGHT": "3"}, func(c *app.Config) bool { return c.TenantMaxInflight == 3 }},
	} {
		c, err := app.LoadConfig(envOf(tc.env))
		if err != nil || !tc.want(c) {
			t.Errorf("%v: %+v, %v", tc.env, c, err)
		}
	}
}
