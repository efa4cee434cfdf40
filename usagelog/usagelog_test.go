package usagelog_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/testkit/worktest"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/usagelog"
)

// Four jobs of one tenant forming reports at once never put a log in two
// reports of one dimension: FOR UPDATE SKIP LOCKED and the report column
// set once are the referee. Every log with overage in a dimension ends in
// exactly one report of it, each report's value is its members' sum, and
// the sums agree with the logs.
func TestConcurrentFormsNeverShareALog(t *testing.T) {
	t.Parallel()
	w := worktest.New(t, worktest.Options{Tenants: []tenants.CreateParams{{StripeCustomerID: "cus_form"}}})
	tn := w.Tenants["cus_form"].ID
	var ids []uuid.UUID
	for i := range 120 {
		// Every third log has no output overage.
		ids = append(ids, worktest.Record(t, w.Ingest, tn, time.Now().Add(-time.Minute), int64(i+1), int64(i%3)))
	}
	store := usagelog.New(w.Pool)
	p := usagelog.FormParams{TenantID: tn, MaxLogs: 7, Lease: time.Minute, Guard: usagelog.GuardFor(24 * time.Hour)}
	var mu sync.Mutex
	var reports []usagelog.Report
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				rs, err := store.Form(context.Background(), p)
				if err != nil {
					t.Error(err)
					return
				}
				if len(rs) == 0 {
					return
				}
				mu.Lock()
				reports = append(reports, rs...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	in := map[uuid.UUID]int{}
	out := map[uuid.UUID]int{}
	var sum [2]int64
	for _, r := range reports {
		if len(r.Members) > p.MaxLogs || r.Members[0] != r.Lead || r.State != usagelog.ReportOpen || r.Remaining < 22*time.Hour || r.Remaining > 23*time.Hour {
			t.Fatalf("report %+v", r)
		}
		for _, m := range r.Members {
			if r.Dimension == overage.DimensionInput {
				in[m]++
			} else {
				out[m]++
			}
		}
		if r.Dimension == overage.DimensionInput {
			sum[0] += r.Value
		} else {
			sum[1] += r.Value
		}
	}
	var wantIn, wantOut int64
	for i, id := range ids {
		wantIn += int64(i + 1)
		wantOut += int64(i % 3)
		if in[id] != 1 {
			t.Fatalf("log %d is in %d input reports", i, in[id])
		}
		if want := min(i%3, 1); out[id] != want {
			t.Fatalf("log %d (output overage %d) is in %d output reports", i, i%3, out[id])
		}
	}
	if sum[0] != wantIn || sum[1] != wantOut {
		t.Fatalf("report values sum to %v, the logs' overage to %d/%d", sum, wantIn, wantOut)
	}
	// Nothing is left to form, and the column on each log names its report.
	if rs, err := store.Form(context.Background(), p); err != nil || len(rs) != 0 {
		t.Fatalf("formed again: %+v %v", rs, err)
	}
	var unformed int
	if err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM usage_logs
		WHERE input_report_lead IS NULL OR (coalesce(overage_output_tokens, output_tokens) > 0) <> (output_report_lead IS NOT NULL)`).Scan(&unformed); err != nil || unformed != 0 {
		t.Fatalf("%d logs whose report columns disagree (%v)", unformed, err)
	}
}
