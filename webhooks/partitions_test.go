package webhooks_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/webhooks"
	"github.com/overage-billing/overage/webhooks/partitions"
)

// dbNow is the database's clock, which received_at and every bound follow.
func (h *harness) dbNow(t *testing.T) time.Time {
	t.Helper()
	var now time.Time
	if err := h.pool.QueryRow(context.Background(), `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now.UTC()
}

// repartition drops every partition (all empty in a new test database)
// and makes them again with a bound at each of uppers, oldest first, the
// first from MINVALUE, then the months ahead as `overage work` keeps them.
// It returns the partitions.
func (h *harness) repartition(t *testing.T, uppers ...time.Time) []partitions.Partition {
	t.Helper()
	ctx := context.Background()
	ps, err := partitions.Partitions(ctx, h.pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if _, err := h.pool.Exec(ctx, fmt.Sprintf(`DROP TABLE %s`, p.Name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range uppers {
		for {
			name, err := partitions.Add(ctx, h.pool, u)
			if err != nil {
				t.Fatal(err)
			}
			if name == "" {
				break
			}
		}
	}
	if _, err := partitions.Ensure(ctx, h.pool); err != nil {
		t.Fatal(err)
	}
	ps, err = partitions.Partitions(ctx, h.pool)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// partitionOf names the partition holding the event.
func (h *harness) partitionOf(t *testing.T, id string) string {
	t.Helper()
	var name string
	if err := h.pool.QueryRow(context.Background(), `SELECT tableoid::regclass::text FROM stripe_webhook_events
		WHERE event_id = $1`, id).Scan(&name); err != nil {
		t.Fatalf("partition of %s: %v", id, err)
	}
	return name
}

// meterErrorEvent is an event whose one effect is a meter error report of
// meter "mtr_"+id: counting the reports counts its applications.
func meterErrorEvent(id string) []byte {
	return eventJSON(id, "", "billing.meter.error_report_triggered", time.Now(),
		map[string]any{"id": "mtr_" + id, "object": "billing.meter"})
}

// requireStoredAndAppliedOnce requires one row of the meter error event
// id, then processes every stored event and requires its one report.
func (h *harness) requireStoredAndAppliedOnce(t *testing.T, id string) {
	t.Helper()
	if n := h.count(t, `SELECT count(*) FROM stripe_webhook_events WHERE event_id = $1`, id); n != 1 {
		t.Fatalf("%s is stored %d times, want once", id, n)
	}
	h.startProcessor(t)
	h.waitAllProcessed(t, h.count(t, `SELECT count(*) FROM stripe_webhook_events`))
	if n := h.count(t, `SELECT count(*) FROM meter_error_reports WHERE meter_id = $1`, "mtr_"+id); n != 1 {
		t.Fatalf("%s made %d meter error reports, want 1", id, n)
	}
}

// waitPastBound waits until the database's clock has passed bound, so a
// delivery from now on is stored in the partition after it.
func (h *harness) waitPastBound(t *testing.T, bound time.Time) {
	t.Helper()
	polltest.Until(t, "the database clock to pass the bound", 10*time.Second, func() bool {
		return h.dbNow(t).After(bound)
	})
}

// Two deliveries of one event, the first stored just before a partition
// bound and the second just after it, race where the month's unique index
// cannot referee them: the first is held between its lookup and its
// insert until the second is waiting on the event's lock (or, were the
// lock gone, has looked too and reached the same point). The event is
// stored once, in the first's partition, and processed once.
func TestConcurrentDuplicatesAcrossAPartitionBoundAreStoredAndProcessedOnce(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()
	// A margin for a loaded machine: the first delivery must begin
	// before the bound.
	bound := h.dbNow(t).Add(3 * time.Second)
	before := h.repartition(t, bound)[0].Name
	body := meterErrorEvent("evt_race")
	ev := webhooks.StoredEvent{ID: "evt_race", Account: webhooks.PlatformAccount, Type: "billing.meter.error_report_triggered", Payload: body}

	var mu sync.Mutex
	reached := 0 // deliveries between lookup and insert
	release := make(chan struct{})
	h.handler.SetBeforeInsert(func(e webhooks.StoredEvent) {
		if e.ID != ev.ID {
			return
		}
		mu.Lock()
		reached++
		first := reached == 1
		mu.Unlock()
		if first {
			<-release
		}
	})
	results := make(chan error, 2)
	store := func() {
		res, err := h.handler.Store(ctx, ev)
		if err == nil && res.Seq == 0 {
			err = fmt.Errorf("no seq: %+v", res)
		}
		results <- err
	}
	go store()
	polltest.Until(t, "the first delivery to look the event up", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return reached == 1
	})
	h.waitPastBound(t, bound)
	go store()
	polltest.Until(t, "the second delivery to wait on the event's lock or to race past it", 10*time.Second, func() bool {
		mu.Lock()
		raced := reached == 2
		mu.Unlock()
		return raced || h.count(t, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
			WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()`) > 0
	})
	close(release)
	for range 2 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	if p := h.partitionOf(t, "evt_race"); p != before {
		t.Fatalf("the first delivery stored the event in %s, after the bound: the machine was too slow to race across %s", p, before)
	}
	h.requireStoredAndAppliedOnce(t, "evt_race")
	if reached != 1 {
		t.Fatalf("%d deliveries looked the event up before it was stored, want 1", reached)
	}
}

// Many deliveries of one event sent at once over HTTP while the clock
// crosses a partition bound: every one answers 200, one row, one effect.
func TestABurstOfDuplicatesAcrossAPartitionBoundIsStoredOnce(t *testing.T) {
	t.Parallel()
	h := setup(t)
	bound := h.dbNow(t).Add(time.Second)
	h.repartition(t, bound)
	body := meterErrorEvent("evt_burst")
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(2 * time.Second)
			for time.Now().Before(deadline) {
				if st, b := h.post(t, body, secret, time.Now()); st != 200 {
					errs <- fmt.Sprintf("%d %s", st, b)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatalf("a delivery answered %s, want 200", e)
	}
	if !h.dbNow(t).After(bound) {
		t.Fatal("the burst ended before the bound: it tested one partition only")
	}
	h.requireStoredAndAppliedOnce(t, "evt_burst")
}

// A redelivery finds the event in the older partition it was stored in: a processed one answers 200 and is not applied again; one
// stored and never processed gets its job again and is applied once.
func TestADuplicateOfAnEventInAnOlderPartitionIsNotProcessedAgain(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()
	now := h.dbNow(t)
	older := h.repartition(t, now.Add(-30*24*time.Hour))[0].Name
	// Both stored 40 days ago, as a delivery then stored them; only
	// evt_done got its job (evt_owed's was lost): only a redelivery can
	// have evt_owed applied.
	done, owed := meterErrorEvent("evt_done"), meterErrorEvent("evt_owed")
	var doneSeq int64
	for _, e := range []struct {
		id   string
		body []byte
	}{{"evt_done", done}, {"evt_owed", owed}} {
		var seq int64
		if err := h.pool.QueryRow(ctx, `INSERT INTO stripe_webhook_events (event_id, account, type, payload, received_at)
			VALUES ($1, 'platform', 'billing.meter.error_report_triggered', $2, $3) RETURNING seq`,
			e.id, string(e.body), now.Add(-40*24*time.Hour)).Scan(&seq); err != nil {
			t.Fatal(err)
		}
		if doneSeq == 0 {
			doneSeq = seq
		}
	}
	if _, err := h.rc.Insert(ctx, outbox.ProcessWebhookArgs{Seq: doneSeq}, nil); err != nil {
		t.Fatal(err)
	}
	stop := h.startProcessor(t)
	polltest.Until(t, "evt_done processed", 20*time.Second, func() bool {
		return h.count(t, `SELECT count(*) FROM stripe_webhook_events WHERE event_id = 'evt_done' AND processed_at IS NOT NULL`) == 1
	})
	stop()
	if n := h.count(t, `SELECT count(*) FROM stripe_webhook_events WHERE event_id = 'evt_owed' AND processed_at IS NULL`); n != 1 {
		t.Fatal("evt_owed was processed without its job: the test sets up nothing")
	}
	var first time.Time
	if err := h.pool.QueryRow(ctx, `SELECT processed_at FROM stripe_webhook_events WHERE event_id = 'evt_done'`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	jobs := h.webhookJobs(t)
	for _, body := range [][]byte{done, owed} {
		st, b := h.post(t, body, secret, time.Now())
		if st != 200 || !strings.Contains(b, `"duplicate":true`) {
			t.Fatalf("redelivery 40 days on: %d %s, want 200 duplicate", st, b)
		}
	}
	if n := h.webhookJobs(t); n != jobs+1 {
		t.Fatalf("%d webhook jobs after the redeliveries, want %d: one for the unprocessed event only", n, jobs+1)
	}
	h.startProcessor(t)
	h.waitAllProcessed(t, 2)
	var again time.Time
	if err := h.pool.QueryRow(ctx, `SELECT processed_at FROM stripe_webhook_events WHERE event_id = 'evt_done'`).Scan(&again); err != nil {
		t.Fatal(err)
	}
	if !again.Equal(first) {
		t.Fatal("the processed event was processed again")
	}
	for _, id := range []string{"evt_done", "evt_owed"} {
		if p := h.partitionOf(t, id); p != older {
			t.Fatalf("%s is in %s, want the older partition %s", id, p, older)
		}
	}
	if n := h.count(t, `SELECT count(*) FROM stripe_webhook_events`); n != 2 {
		t.Fatalf("%d events stored, want 2", n)
	}
	if n := h.count(t, `SELECT count(*) FROM meter_error_reports WHERE meter_id IN ('mtr_evt_done', 'mtr_evt_owed')`); n != 2 {
		t.Fatalf("%d meter error reports, want one of each event", n)
	}
}

// Retention drops whole partitions: those whose whole range is older than
// 365 days and whose every event is processed. One holding an unprocessed
// event is kept and reported until it is processed; nothing is deleted
// from the partitions kept.
func TestRetentionDropsOnlyOldFullyProcessedPartitions(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()
	now := h.dbNow(t)
	day := 24 * time.Hour
	h.repartition(t, now.Add(-400*day), now.Add(-380*day), now.Add(-300*day))
	if _, err := h.pool.Exec(ctx, `INSERT INTO stripe_webhook_events (event_id, account, type, payload, received_at, processed_at) VALUES
		('evt_old', 'platform', 'x', '{}', $1, $1),
		('evt_stuck', 'platform', 'x', '{}', $2, NULL),
		('evt_recent', 'platform', 'x', '{}', $3, $3)`,
		now.Add(-401*day), now.Add(-390*day), now.Add(-364*day)); err != nil {
		t.Fatal(err)
	}
	oldP, stuckP, recentP := h.partitionOf(t, "evt_old"), h.partitionOf(t, "evt_stuck"), h.partitionOf(t, "evt_recent")
	ps, err := partitions.Partitions(ctx, h.pool)
	if err != nil {
		t.Fatal(err)
	}
	var past []string // every partition whose range ended 365 days ago
	for _, p := range ps {
		if !p.Upper.After(now.Add(-webhooks.Retention)) {
			past = append(past, p.Name)
		}
	}
	if !slices.Contains(past, oldP) || !slices.Contains(past, stuckP) || slices.Contains(past, recentP) {
		t.Fatalf("partitions past retention %v; the test wants %s and %s among them and not %s", past, oldP, stuckP, recentP)
	}

	res, err := partitions.DropExpired(ctx, h.pool, webhooks.Retention)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.DeleteFunc(slices.Clone(past), func(n string) bool { return n == stuckP })
	if !slices.Equal(res.Dropped, want) {
		t.Fatalf("dropped %v, want %v (every partition past retention but the one with an unprocessed event)", res.Dropped, want)
	}
	if len(res.Kept) != 1 || res.Kept[0].Name != stuckP || res.Kept[0].Unprocessed != 1 {
		t.Fatalf("kept %+v, want %s with its one unprocessed event", res.Kept, stuckP)
	}
	if n := h.count(t, `SELECT count(*) FROM stripe_webhook_events`); n != 2 {
		t.Fatalf("%d events left, want evt_stuck and evt_recent", n)
	}
	if h.count(t, `SELECT count(*) FROM stripe_webhook_events WHERE event_id IN ('evt_stuck', 'evt_recent')`) != 2 {
		t.Fatal("an event of a kept partition is gone")
	}
	if n := h.count(t, `SELECT count(*) FROM pg_class WHERE relname = ANY($1)`, res.Dropped); n != 0 {
		t.Fatalf("%d dropped partitions still exist as tables", n)
	}

	// Processed at last: its partition goes on the next run.
	if _, err := h.pool.Exec(ctx, `UPDATE stripe_webhook_events SET processed_at = now() WHERE event_id = 'evt_stuck'`); err != nil {
		t.Fatal(err)
	}
	res, err = partitions.DropExpired(ctx, h.pool, webhooks.Retention)
	if err != nil || !slices.Equal(res.Dropped, []string{stuckP}) || len(res.Kept) != 0 {
		t.Fatalf("after processing: %+v %v, want %s dropped", res, err, stuckP)
	}
	if n := h.count(t, `SELECT count(*) FROM stripe_webhook_events WHERE event_id = 'evt_recent'`); n != 1 {
		t.Fatal("the recent event is gone")
	}
}

// `overage migrate` leaves partitions without gaps from MINVALUE to the
// months ahead, and Maintain keeps them so when run again.
func TestMigrateLeavesMonthsAheadWithoutGaps(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()
	if err := partitions.Maintain(ctx, h.pool, webhooks.Retention, nil); err != nil {
		t.Fatal(err)
	}
	ps, err := partitions.Partitions(ctx, h.pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) < 2 || ps[0].Lower != nil {
		t.Fatalf("partitions %+v: want the first from MINVALUE and months after it", ps)
	}
	for i := 1; i < len(ps); i++ {
		if ps[i].Lower == nil || !ps[i].Lower.Equal(ps[i-1].Upper) {
			t.Fatalf("gap or overlap between %s and %s", ps[i-1].Name, ps[i].Name)
		}
		if ps[i].Lower.Day() != 1 || ps[i].Upper.Day() != 1 || !strings.HasPrefix(ps[i].Name, "stripe_webhook_events_2") {
			t.Fatalf("partition %+v is not a UTC month", ps[i])
		}
	}
	now := h.dbNow(t)
	horizon := time.Date(now.Year(), now.Month()+partitions.Ahead+1, 1, 0, 0, 0, 0, time.UTC)
	if last := ps[len(ps)-1].Upper; !last.Equal(horizon) {
		t.Fatalf("partitions end at %s, want %s", last, horizon)
	}
	for _, p := range ps {
		if n := h.count(t, `SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE 'CREATE UNIQUE INDEX % (event_id, account)'`, p.Name); n != 1 {
			t.Fatalf("partition %s has %d unique indexes on (event_id, account), want 1", p.Name, n)
		}
	}
}

// The statements on stripe_webhook_events stay index reads across the
// partitions at any size, with the generic plans made on empty tables and
// no statistics: the processor's next event (a merge by seq of each
// partition's index of unprocessed events), its mark, the store's lookup
// and the reaper's requeue.
func TestWebhookStatementsReadIndexesAcrossPartitions(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()
	now := h.dbNow(t)
	h.repartition(t, now.Add(-400*24*time.Hour), now.Add(-30*24*time.Hour))
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	probes := []pgtest.Probe{
		{Name: "next unprocessed", SQL: `SELECT seq, received_at, event_id, account, type, coalesce(event_created, received_at), payload
			FROM stripe_webhook_events WHERE processed_at IS NULL AND seq <= $1
			ORDER BY seq LIMIT 1 FOR UPDATE`, Args: "(9223372036854775807)"},
		{Name: "mark processed", SQL: `UPDATE stripe_webhook_events SET processed_at = clock_timestamp(), process_outcome = $3
			WHERE seq = $1 AND received_at = $2 AND processed_at IS NULL`, Args: "(42, now(), 'x')"},
		{Name: "store lookup", SQL: `SELECT seq, processed_at FROM stripe_webhook_events
			WHERE event_id = $1 AND account = $2 FOR UPDATE`, Args: "('evt_5000', 'platform')"},
		{Name: "requeue", SQL: `SELECT max(seq) FROM stripe_webhook_events
			WHERE processed_at IS NULL AND received_at < now() - interval '1 minute'`},
	}
	pgtest.CachePlans(t, conn.Conn(), probes)
	// 100,000 processed events over three partitions, and one unprocessed.
	if _, err := h.pool.Exec(ctx, `INSERT INTO stripe_webhook_events (event_id, account, type, payload, received_at, processed_at)
		SELECT 'evt_' || g, 'platform', 'x', '{"id": "evt"}', now() - (g % 3) * interval '200 days', now() FROM generate_series(1, 100000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, `INSERT INTO stripe_webhook_events (event_id, account, type, payload, received_at)
		VALUES ('evt_owed', 'platform', 'x', '{}', now() - interval '2 minutes')`); err != nil {
		t.Fatal(err)
	}
	for i, r := range pgtest.PlanReads(t, conn.Conn(), probes) {
		if r.Pages > 100 || r.Removed > 10 {
			t.Errorf("%s reads %.0f pages and removes %.0f rows at 100,000 events; want index reads:\n%s", probes[i].Name, r.Pages, r.Removed, r.Plan)
		}
	}
}
