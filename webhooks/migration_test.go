package webhooks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/webhooks/partitions"
)

// Migrations 0044-0046 move the webhook events to a partitioned table on a
// live system: while four senders deliver events (each one twice, and
// redeliveries of events stored before), the migration runs; no delivery
// fails, every event is stored once (one delivery of it is new, every other
// a duplicate), the events of the old shape are all in the first
// partition, seq goes on above them, and each stored event is then
// processed once, in order.
func TestPartitioningMigrationUnderDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewEmptyPool(t)
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 43); err != nil {
		t.Fatal(err)
	}
	const seeded = 50_000
	// The old shape: processed events over the past months, and three
	// stored but never processed.
	if _, err := pool.Exec(ctx, `INSERT INTO stripe_webhook_events (event_id, account, type, payload, received_at, processed_at, process_outcome)
		SELECT 'evt_old_' || g, 'platform', 'invoice.paid', '{}', now() - (g % 300) * interval '1 day', now(), 'ignored'
		FROM generate_series(1, $1::int) g`, seeded); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		body := meterErrorEvent(fmt.Sprintf("evt_old_owed_%d", i))
		if _, err := pool.Exec(ctx, `INSERT INTO stripe_webhook_events (event_id, account, type, payload)
			VALUES ($1, 'platform', 'billing.meter.error_report_triggered', $2)`, fmt.Sprintf("evt_old_owed_%d", i), string(body)); err != nil {
			t.Fatal(err)
		}
	}
	var maxSeeded int64
	if err := pool.QueryRow(ctx, `SELECT max(seq) FROM stripe_webhook_events`).Scan(&maxSeeded); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, pool)

	// Each sender delivers its events twice and, every tenth, redelivers
	// an event stored before the migration.
	var (
		delivered atomic.Int64
		stop      atomic.Bool
		mu        sync.Mutex
		fresh     = map[string]int{} // event id -> deliveries answered as new
		failures  []string
		wg        sync.WaitGroup
	)
	for s := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				id := fmt.Sprintf("evt_live_%d_%d", s, i)
				body := meterErrorEvent(id)
				deliveries := [][]byte{body, body}
				if i%10 == 0 {
					deliveries = append(deliveries, eventJSON(fmt.Sprintf("evt_old_%d", 1+i%seeded), "", "invoice.paid", time.Now(), map[string]any{"id": "in_old"}))
				}
				for j, b := range deliveries {
					st, resp := h.post(t, b, secret, time.Now())
					var r struct {
						Duplicate bool `json:"duplicate"`
					}
					mu.Lock()
					if err := json.Unmarshal([]byte(resp), &r); st != 200 || err != nil {
						failures = append(failures, fmt.Sprintf("%s: %d %s", id, st, resp))
					} else if j == 2 && !r.Duplicate {
						failures = append(failures, fmt.Sprintf("a redelivery of a seeded event after %s was stored anew", id))
					} else if j < 2 && !r.Duplicate {
						fresh[id]++
					}
					mu.Unlock()
				}
				delivered.Add(1)
			}
		}()
	}
	polltest.Until(t, "deliveries before the migration", 20*time.Second, func() bool { return delivered.Load() >= 50 })
	before := delivered.Load()
	res, err := migrations.Migrate(ctx, pool, nil)
	if err != nil {
		stop.Store(true)
		wg.Wait()
		t.Fatalf("migrate under deliveries: %v", err)
	}
	during := delivered.Load() - before
	polltest.Until(t, "deliveries after the migration", 20*time.Second, func() bool { return delivered.Load() >= before+during+50 })
	stop.Store(true)
	wg.Wait()

	if len(failures) > 0 {
		t.Fatalf("%d deliveries went wrong, the first: %s", len(failures), failures[0])
	}
	moved := 0
	for _, m := range res.Applied {
		if m.Version >= 44 && m.Version <= 46 {
			moved++
		}
	}
	if moved != 3 || len(res.WebhookPartitions) == 0 {
		t.Fatalf("migrate applied %d of 0044-0046 and created partitions %v; want the three and the months after the bound", moved, res.WebhookPartitions)
	}
	ps, err := partitions.Partitions(ctx, pool)
	if err != nil || len(ps) < 2 || ps[0].Name != "stripe_webhook_events_legacy" || ps[0].Lower != nil {
		t.Fatalf("partitions %+v (%v): want the table before the migration first", ps, err)
	}
	if n := h.count(t, `SELECT count(*) FROM stripe_webhook_events_legacy WHERE event_id LIKE 'evt_old_%'`); n != seeded+3 {
		t.Fatalf("%d events of the old shape in the first partition, want %d", n, seeded+3)
	}
	for id, n := range fresh {
		if n != 1 {
			t.Fatalf("%s was answered as new %d times, want once", id, n)
		}
	}
	var rows, events, seqs int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (event_id, account)), count(DISTINCT seq) FROM stripe_webhook_events`).Scan(&rows, &events, &seqs); err != nil {
		t.Fatal(err)
	}
	if want := seeded + 3 + len(fresh); rows != want || events != want || seqs != want {
		t.Fatalf("%d rows, %d events, %d seqs; want %d of each (seeded and one a delivered event)", rows, events, seqs, want)
	}
	if n := h.count(t, `SELECT count(*) FROM stripe_webhook_events WHERE event_id LIKE 'evt_live_%' AND seq <= $1`, maxSeeded); n != 0 {
		t.Fatalf("%d delivered events took a seq at or below the seeded ones' %d", n, maxSeeded)
	}
	t.Logf("%d events delivered, %d of them while the migration ran", len(fresh), during)

	h.startProcessor(t)
	h.waitAllProcessed(t, seeded+3+len(fresh))
	if n := h.count(t, `SELECT count(*) FROM meter_error_reports`); n != 3+len(fresh) {
		t.Fatalf("%d meter error reports, want one for each of the %d events owed", n, 3+len(fresh))
	}
	if n := h.count(t, `SELECT count(*) FROM (SELECT seq < lag(seq) OVER (ORDER BY processed_at) AS back
		FROM stripe_webhook_events WHERE type = 'billing.meter.error_report_triggered') s WHERE back`); n != 0 {
		t.Fatalf("%d events processed after a later one, want arrival (seq) order", n)
	}
}
