package ingest_test

import (
	"context"
	"net/http"
	"testing"
)

// A suspended tenant (its Stripe customer was deleted) gets 403
// tenant-suspended on every route that records usage — single events,
// stream checkpoints, batches, corrections, LiteLLM deliveries — and
// nothing is recorded or stored under the key; it may still read what it
// recorded. Once the suspension is lifted, the same requests are taken.
func TestSuspendedTenantRecordsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.post(t, b.alice.APIKey, "before", event(70, 30)).json(t)["id"].(string)
	if _, err := b.pool.Exec(ctx, `UPDATE tenants SET suspended_at = now(), suspended_reason = 'Stripe customer deleted; tenant suspended' WHERE id = $1`, b.alice.ID); err != nil {
		t.Fatal(err)
	}
	logs := func() int { return b.count(t, `SELECT count(*) FROM usage_logs WHERE tenant_id = $1`, b.alice.ID) }
	keys := func() int {
		return b.count(t, `SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1`, b.alice.ID)
	}
	logsBefore, keysBefore := logs(), keys()
	requests := []struct {
		name, path, key, body string
	}{
		{"single event", "/v1/usage-events", "s-1", event(10, 5)},
		{"stream checkpoint", "/v1/usage-events", "s-2", checkpoint("stream-1", 1, false, 10, 5)},
		{"batch", "/v1/usage-events/batch", "s-3", batch(batchEvent("b-1", 10, 5), batchEvent("b-2", 10, 5))},
		{"correction", "/v1/usage-events/" + id + "/corrections", "s-4", correction(0, 0, "void")},
		{"LiteLLM delivery", "/v1/integrations/litellm", "", litellmDelivery(t, 0, 1)},
	}
	for _, r := range requests {
		p := requireProblem(t, b.do(t, http.MethodPost, r.path, b.alice.APIKey, r.key, r.body), http.StatusForbidden, "tenant-suspended")
		if p["detail"] == "" {
			t.Fatalf("%s: tenant-suspended without a detail", r.name)
		}
	}
	if n, k := logs(), keys(); n != logsBefore || k != keysBefore {
		t.Fatalf("a suspended tenant's requests recorded %d logs and %d keys", n-logsBefore, k-keysBefore)
	}
	// Reads are not refused: the tenant may see what it recorded.
	requireStatus(t, b.do(t, http.MethodGet, "/v1/usage-events/"+id, b.alice.APIKey, "", ""), http.StatusOK)
	// Another tenant is not affected.
	requireStatus(t, b.post(t, b.bob.APIKey, "s-1", event(10, 5)), http.StatusAccepted)

	if _, err := b.pool.Exec(ctx, `UPDATE tenants SET suspended_at = NULL, suspended_reason = NULL WHERE id = $1`, b.alice.ID); err != nil {
		t.Fatal(err)
	}
	for _, r := range requests {
		if got := b.do(t, http.MethodPost, r.path, b.alice.APIKey, r.key, r.body); got.status >= 300 {
			t.Fatalf("%s after the suspension was lifted: %d %s", r.name, got.status, got.body)
		}
	}
}
