package alerts_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/overage-billing/overage/alerts"
	"github.com/overage-billing/overage/client"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/worktest"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/workers"
)

// The production wiring (app's ingest, workers.New with its alerts queue)
// end to end: the tenant's first endpoint hangs, yet its overage is billed
// to Stripe meanwhile; the delivery is cut, retried and arrives at the
// endpoint, which verifies it with client.VerifyWebhook.
func TestEndToEndDeliveryHoldsUpNoBilling(t *testing.T) {
	t.Parallel()
	w := worktest.New(t, worktest.Options{Tenants: []tenants.CreateParams{{StripeCustomerID: "cus_e2e", IncludedInputTokens: 1000, IncludedOutputTokens: 1000}}})
	ten := w.Tenants["cus_e2e"]
	hang := make(chan struct{})
	var calls atomic.Int64
	var mu sync.Mutex
	var verified []string
	var secret string
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if calls.Add(1) == 1 {
			select { // the first attempt hangs until it is cut
			case <-r.Context().Done():
			case <-hang:
			}
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if err := client.VerifyWebhook(secret, r.Header.Get("Overage-Signature"), body, 5*time.Minute); err != nil {
			rw.WriteHeader(http.StatusBadRequest)
			return
		}
		verified = append(verified, r.Header.Get("Overage-Event-Id"))
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(hang) })
	url, at := srv.URL, []int{100}
	d, err := tenants.NewStore(w.Pool).Update(context.Background(), ten.ID, tenants.UpdateParams{AlertURL: &url, AlertAt: &at})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	secret = d.AlertSecret
	mu.Unlock()
	w.Start(t, workers.Config{Alerts: alerts.DeliverConfig{Timeout: 3 * time.Second, BaseBackoff: 50 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}})
	started := time.Now()
	for range 3 {
		w.Record(t, "cus_e2e", 500, 1) // 1,500 input: across 100%, 500 of overage
	}
	polltest.Until(t, "the overage billed while the endpoint hangs", 10*time.Second, func() bool {
		var pending int
		_ = w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM usage_logs WHERE billing_status = 'pending'`).Scan(&pending)
		return pending == 0 && calls.Load() == 1
	})
	if time.Since(started) > 3*time.Second {
		t.Errorf("billing waited %s, past the hanging attempt's timeout", time.Since(started))
	}
	polltest.Until(t, "the event delivered and verified", 15*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(verified) == 1
	})
	var l *alerts.EventList
	polltest.Until(t, "the event's status delivered", 5*time.Second, func() bool {
		l, err = alerts.Events(context.Background(), w.Pool, ten.ID, [16]byte{}, 10)
		return err == nil && len(l.Data) == 1 && l.Data[0].Delivery.Status == "delivered"
	})
	if l.Data[0].ID != verified[0] || l.Data[0].Delivery.Attempts != 2 {
		t.Errorf("event %+v, delivered %v", l.Data[0], verified)
	}
}
