package reconcile_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/finance"
	"github.com/overage-billing/overage/internal/page"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/retentiontest"
	"github.com/overage-billing/overage/internal/testkit/worktest"
	"github.com/overage-billing/overage/reconcile"
	"github.com/overage-billing/overage/retention"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/usagelog"
)

// A clean run's logs, billed through the real pipeline into the emulator,
// are rolled up and their partition dropped while ingest goes on into the
// next partition. Reconcile gives the same answer before and after the
// drop (the billed sums of the dropped days now come from the rollups);
// the finance statement is the same but for the logs ingested meanwhile
// (the counters keep counting the dropped logs: a DROP fires no trigger),
// its totals are still its lines' sums, and rebuilding the counters from
// the logs and the rollups changes nothing. No log ingested during the
// drop is lost.
func TestReconcileAndFinanceAreTheSameAfterADrop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The fixture's logs are minted now: the first partition ends a few
	// seconds from now, the second runs to the end of the month, and the
	// months after are made as usual. The first begins 48 hours ago or at
	// the month's start, whichever is earlier: begun later in the month,
	// EnsurePartitions would make the month's part before it, and that
	// empty partition would be the first dropped.
	var bound time.Time
	var first string
	f := newFixture(t, emulator.Options{}, func(pool *pgxpool.Pool) {
		now := time.Now().UTC()
		bound = now.Add(15 * time.Second)
		from := now.Add(-48 * time.Hour)
		if m := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC); m.Before(from) {
			from = m
		}
		next := time.Date(bound.Year(), bound.Month(), 1, 0, 0, 0, 0, time.UTC).AddDate(0, 1, 0)
		first = retentiontest.Replace(t, pool, from, bound, next)[0]
	})
	var inFirst int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM `+first).Scan(&inFirst); err != nil {
		t.Fatal(err)
	}
	if inFirst == 0 {
		t.Fatalf("the fixture's logs were all recorded after %s: the machine is too slow for this test's bound", bound)
	}
	polltest.Until(t, "the first partition's range is past", 30*time.Second, func() bool { return time.Now().After(bound.Add(time.Second)) })
	// Every period of the tenants is closed (as Stripe's invoice.finalized
	// would): retention drops nothing of an open period.
	if _, err := f.pool.Exec(ctx, `INSERT INTO closed_periods (tenant_id, stripe_invoice_id, period_start, period_end, event_created)
		SELECT id, 'in_retention', now() - interval '60 days', now(), now() FROM tenants`); err != nil {
		t.Fatal(err)
	}

	params := reconcile.Params{SettleAfter: settled}
	before := f.run(t, params)
	statusBefore := status(t, f.pool)
	totalsBefore, err := usagelog.BilledTotals(ctx, f.pool, nil, "")
	if err != nil {
		t.Fatal(err)
	}

	// Ingest goes on, into the second partition, while retention runs.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var during []uuid.UUID
	var ingestErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id, err := worktest.TryRecord(ctx, f.ingest, f.tenants["cus_a"].ID, f.today.Add(time.Duration(i)*time.Millisecond), 1, 1)
			mu.Lock()
			if err != nil && ingestErr == nil {
				ingestErr = err
			}
			if err == nil {
				during = append(during, id)
			}
			mu.Unlock()
		}
	}()
	polltest.Until(t, "ingest running", 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(during) > 0 })
	res, err := retention.Run(ctx, f.pool, retention.Config{Retention: time.Millisecond, CloseGrace: time.Hour}, false)
	polltest.Until(t, "more ingest after the drop", 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(during) > 20 })
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("retention: %v", err)
	}
	if ingestErr != nil {
		t.Fatalf("ingest during the drop: %v", ingestErr)
	}
	if res.Dropped() != 1 || res.Partitions[0].Partition != first || res.Partitions[0].Action != retention.ActionDropped ||
		*res.Partitions[0].Logs != int64(inFirst) {
		t.Fatalf("retention: %+v, want %s (%d logs) dropped first", res.Partitions, first, inFirst)
	}
	var kept int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE id = ANY($1)`, during).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	if kept != len(during) {
		t.Fatalf("%d of the %d logs ingested during the drop are there", kept, len(during))
	}

	after := f.run(t, params)
	if !slices.Equal(after.Rows, before.Rows) || after.Matches != before.Matches || after.Differences != before.Differences ||
		after.TooRecent != before.TooRecent {
		t.Errorf("reconcile after the drop:%s\nbefore:%s", dumpRows(after), dumpRows(before))
	}
	totalsAfter, err := usagelog.BilledTotals(ctx, f.pool, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(totalsAfter, totalsBefore) {
		t.Errorf("billed totals after the drop %v, before %v", totalsAfter, totalsBefore)
	}

	statusAfter := status(t, f.pool)
	want := statusBefore
	want.UsageLogs += int64(len(during))
	want.Pending += int64(len(during))
	want.OverageInputTokens += int64(len(during))
	want.OverageOutputTokens += int64(len(during))
	for i := range want.Meters {
		want.Meters[i].OverageTokens += int64(len(during))
	}
	statusAfter.OldestPendingAt, want.OldestPendingAt = nil, nil
	if fmt.Sprint(statusAfter) != fmt.Sprint(want) {
		t.Errorf("finance totals after the drop %+v, want %+v", statusAfter, want)
	}
	if err := finance.RebuildCounters(ctx, f.pool); err != nil {
		t.Fatal(err)
	}
	rebuilt := status(t, f.pool)
	rebuilt.OldestPendingAt = nil
	if fmt.Sprint(rebuilt) != fmt.Sprint(statusAfter) {
		t.Errorf("finance totals after rebuilding the counters %+v, want %+v", rebuilt, statusAfter)
	}
}

// status reads the finance statement's totals, checking they agree with
// themselves: the statement's totals (its lines' sums) are the totals the
// API's pages carry (read from the counters in one statement).
func status(t *testing.T, pool *pgxpool.Pool) finance.Counters {
	t.Helper()
	st, err := finance.Status(context.Background(), pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	pg, err := finance.StatusPage(context.Background(), pool, page.First())
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(pg.Totals) != fmt.Sprint(st.Totals) {
		t.Errorf("finance totals %+v, the API's page's %+v", st.Totals, pg.Totals)
	}
	return st.Totals
}
