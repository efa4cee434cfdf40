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
	var diffs, groups int
	if err := pool.QueryRow(ctx, `
		WITH logs AS (
			SELECT u.tenant_id, u.period_start, m.meter, u.billing_status, sum(m.o) AS o
			FROM usage_logs u CROSS JOIN LATERAL (
				SELECT 'input'::text AS meter, u.overage_input_tokens AS o
				UNION ALL SELECT 'output', u.overage_output_tokens
				UNION ALL SELECT x.k, x.o FROM unnest(u.meter_keys, u.meter_overage) AS x (k, o)
			) AS m
			GROUP BY 1, 2, 3, 4 HAVING sum(m.o) <> 0
		), counters AS (
			SELECT tenant_id, period_start, meter, billing_status, sum(overage_tokens) AS o
			FROM period_counters GROUP BY 1, 2, 3, 4 HAVING sum(overage_tokens) <> 0
		)
		SELECT count(*) FILTER (WHERE l.o IS DISTINCT FROM c.o), count(*)
		FROM logs l FULL JOIN counters c USING (tenant_id, period_start, meter, billing_status)`).Scan(&diffs, &groups); err != nil {
		t.Fatal(err)
	}
	if diffs != 0 || groups < 3 {
		t.Fatalf("%d of %d (tenant, period, meter, status) groups differ between period_counters and usage_logs", diffs, groups)
	}
}
