package alerts_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/billingtest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/outbox"
)

// Migrations 0041 (period_counters and their triggers) and 0042 (the
// backfill, without a lock) on a live system: while ingest records events
// and a biller moves logs from pending to billed, they run; afterwards the
// counters equal the sums over the logs, per tenant, period and status.
func TestPeriodCountersMigrationUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewEmptyPool(t)
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 40); err != nil {
		t.Fatal(err)
	}
	tenant := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id, included_input_tokens, included_output_tokens)
		VALUES ($1, 'alice', 'cus_alice', 5000, 1000)`, tenant); err != nil {
		t.Fatal(err)
	}
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc := ingest.NewService(pool, outbox.NewInserter(rc, 5))
	var recorded atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	month := time.Date(time.Now().UTC().Year(), time.Now().UTC().Month(), 1, 0, 0, 0, 0, time.UTC)
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ts := time.Now().UTC().Truncate(time.Microsecond)
				if i%3 == 0 && c%2 == 0 {
					ts = month.Add(-time.Hour) // the previous period too
				}
				key := uuid.NewString()
				if _, err := svc.Record(ctx, ingest.RecordParams{TenantID: tenant, Key: key, Fingerprint: []byte(key),
					Event: &ingest.Event{Timestamp: ts, UserID: "u", ModelID: "m", InputTokens: int64(10 + i%7), OutputTokens: int64(3 + i%5)}}); err != nil {
					errs <- err
					return
				}
				recorded.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() { // the report worker's effect: pending logs billed
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := pool.Exec(ctx, `UPDATE usage_logs SET billing_status = 'billed', billed_at = now()
				WHERE id IN (SELECT id FROM usage_logs WHERE billing_status = 'pending' ORDER BY id LIMIT 25)`); err != nil {
				errs <- err
				return
			}
		}
	}()
	polltest.Until(t, "usage before the migrations", 30*time.Second, func() bool { return recorded.Load() >= 300 })
	// 0041, then usage and billing counted by its triggers only, then the
	// backfill: it must count the older logs and not these again.
	if res, err := migrations.MigrateUpTo(ctx, pool, nil, 41); err != nil || len(res.Applied) != 1 || res.Applied[0].Version != 41 {
		t.Fatalf("migrate 0041 under load: %v %+v", err, res)
	}
	between := recorded.Load()
	polltest.Until(t, "usage between the migrations", 30*time.Second, func() bool { return recorded.Load() >= between+300 })
	res, err := migrations.Migrate(ctx, pool, nil)
	if err != nil {
		t.Fatalf("migrate under load: %v", err)
	}
	if len(res.Applied) < 1 || res.Applied[0].Version != 42 {
		t.Fatalf("applied %+v, want 0042 first", res.Applied)
	}
	after := recorded.Load()
	polltest.Until(t, "usage after the migration", 30*time.Second, func() bool { return recorded.Load() >= after+300 })
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// A few logs the biller never saw: the comparison covers pending
	// groups too, however far the biller got.
	for i := range 3 {
		key := uuid.NewString()
		if _, err := svc.Record(ctx, ingest.RecordParams{TenantID: tenant, Key: key, Fingerprint: []byte(key),
			Event: &ingest.Event{Timestamp: time.Now().UTC().Truncate(time.Microsecond), UserID: "u", ModelID: "m",
				InputTokens: int64(10 + i), OutputTokens: int64(3 + i)}}); err != nil {
			t.Fatal(err)
		}
	}
	differ, groups := billingtest.CountersAgainstLines(t, pool)
	if len(differ) != 0 || groups < 3 {
		t.Fatalf("%d of %d (tenant, period, meter, status) groups differ between period_counters and usage_logs: %v", len(differ), groups, differ)
	}
}
