package workers_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage/internal/testkit/apitest"
	"github.com/overage-billing/overage/internal/testkit/billingtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/retentiontest"
	"github.com/overage-billing/overage/internal/testkit/worktest"
	"github.com/overage-billing/overage/retention"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/workers"
)

// Retention packs a past month of a tenant's logs while `serve` records
// the tenant's single events from four clients, and a fifth client keeps
// sending request_ids of the packed month: no request fails; every one of
// those is answered as the duplicate of its logged event, during the
// month's copy and its swap too (ingest's request_id lookups read every
// partition, and wait for the swap's lock of usage_logs); then `work`
// bills, its own retention finds the month packed, and every new event
// is one log, billed exactly once.
func TestPackingUnderIngestAndBilling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := worktest.New(t, worktest.Options{Emulator: emulator.Options{Seed: 6},
		Tenants: []tenants.CreateParams{{Name: "alice", StripeCustomerID: "cus_alice"}}})
	pool, alice := w.Pool, w.Tenants["cus_alice"]
	jan := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	month := retentiontest.Replace(t, pool, jan, jan.AddDate(0, 1, 0))[0]
	// The month's logs: not billable (Stripe never saw them), one a
	// millisecond from its first instant, each its request_id.
	const seeded = 200_000
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, billing_status, created_at)
		SELECT (lpad(to_hex(floor(extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7' || lpad(to_hex(g % 4096), 3, '0') || '8'
				|| lpad(to_hex(g), 15, '0'))::uuid,
			$1, 'seed-' || g, t, 'u', 'm', 100, 20, date_trunc('month', t, 'UTC'), 'not_billable', t
		FROM (SELECT g, $2::timestamptz + g * interval '1 millisecond' AS t FROM generate_series(1, $3::int) g) AS s`,
		alice.ID, jan, seeded); err != nil {
		t.Fatal(err)
	}

	srv := apitest.StartWith(t, pool, "", apitest.Options{})
	load := startMoveLoad(t, srv.URL, alice.APIKey, 4)
	dups := startDuplicateLoad(t, srv.URL, alice.APIKey, seeded)
	polltest.Until(t, "ingest before the pack", 60*time.Second, func() bool { return load.count() >= 200 && dups.count() >= 20 })
	start := time.Now()
	res, err := retention.Run(ctx, pool, retention.Config{Retention: 0}, false)
	if err != nil {
		t.Fatalf("retention under ingest: %v", err)
	}
	end := time.Now()
	// The work starts once the pack is done: its own retention runs at
	// its start, and would otherwise race this one for the lock. Billing
	// writes the month being ingested, not the packed one
	// (TestPackingLetsTheMonthBeWritten has writes into a month while it
	// is packed).
	w.Start(t, workers.Config{SweepInterval: 500 * time.Millisecond, SweepGrace: time.Millisecond,
		BatchDelay: 100 * time.Millisecond, Retention: 0})
	before := load.count()
	polltest.Until(t, "ingest after the pack", 60*time.Second, func() bool { return load.count() >= before+200 })
	close(load.stop)
	load.wg.Wait()
	close(dups.stop)
	dups.wg.Wait()

	var d retention.Decision
	for _, x := range res.Partitions {
		if x.Partition == month {
			d = x
		}
	}
	if d.Indexes != retention.PackingPacked || d.IndexBytes == nil || d.HeapBytes == nil {
		t.Fatalf("%s not packed by the run: %+v", month, d)
	}
	during := dups.between(start, end)
	t.Logf("the pack took %v (indexes %v bytes, heap %v); %d events recorded, %d duplicates answered, %d of them during the pack; slowest request %v",
		end.Sub(start), *d.IndexBytes, d.HeapBytes, len(load.ids), dups.count(), during, load.slowest)
	if len(load.fail) > 0 || len(dups.fail) > 0 {
		t.Fatalf("requests failed across the pack: %d events, the first %v; %d duplicates, the first %v", len(load.fail), load.fail, len(dups.fail), dups.fail)
	}
	if during == 0 {
		t.Errorf("no duplicate was answered while the pack ran (%v): the test shows nothing of a live pack", end.Sub(start))
	}

	var ids []uuid.UUID
	for _, id := range load.ids {
		ids = append(ids, id)
	}
	var found, total int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM usage_logs WHERE id = ANY($1)),
			(SELECT count(*) FROM usage_logs WHERE tenant_id = $2)`, ids, alice.ID).Scan(&found, &total); err != nil {
		t.Fatal(err)
	}
	if found != len(ids) || total != len(ids)+seeded {
		t.Fatalf("%d events answered: %d found by id, %d logs of the tenant; want one each and the %d seeded", len(ids), found, total, seeded)
	}
	polltest.Until(t, "every new log billed", 120*time.Second, func() bool {
		var pending int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE tenant_id = $1 AND billing_status = 'pending'`, alice.ID).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0
	})
	// Stripe applied exactly what PostgreSQL billed, each event one
	// accepted report.
	billingtest.RequireStripeMatchesBilled(t, pool, w.Emu)
	billed := billingtest.BilledTotals(t, pool)
	if got := billed[emulator.AppliedKey{Customer: "cus_alice", EventName: billingtest.InputEvent}]; got != 7*int64(len(ids)) {
		t.Errorf("input billed %d, want %d", got, 7*len(ids))
	}
}

// duplicateLoad posts, from one client until stopped, events under the
// request_ids of logged events ("seed-N", N in 1..seeded), each with a
// new Idempotency-Key, and checks each answer is the duplicate (200,
// "duplicate": true) of that request_id's log. It keeps when each
// request was sent.
type duplicateLoad struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	answered []time.Time // when each duplicate's request was sent
	fail     []string
}

func startDuplicateLoad(t *testing.T, url, apiKey string, seeded int) *duplicateLoad {
	t.Helper()
	l := &duplicateLoad{stop: make(chan struct{})}
	c := oneAttempt(t, url, apiKey)
	check := func(n int) error {
		rid := fmt.Sprintf("seed-%d", n)
		res, err := recordEvent(c, "dup-"+uuid.NewString(), rid)
		if err != nil {
			return fmt.Errorf("%s: %w", rid, err)
		}
		if !res.Duplicate || res.Log.RequestID == nil || *res.Log.RequestID != rid {
			return fmt.Errorf("%s: not answered as its logged event's duplicate: %+v", rid, res.Log)
		}
		return nil
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			t0 := time.Now()
			err := check(1 + (i*7919)%seeded)
			l.mu.Lock()
			if err != nil {
				l.fail = append(l.fail, err.Error())
			} else {
				l.answered = append(l.answered, t0)
			}
			l.mu.Unlock()
		}
	}()
	return l
}

func (l *duplicateLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.answered)
}

// between counts the duplicates whose request was sent in [from, to).
func (l *duplicateLoad) between(from, to time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, at := range l.answered {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}
