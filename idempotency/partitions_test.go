package idempotency_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

func TestMigrateLeavesAWeekOfPartitionsWithoutGaps(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	ps, err := idempotency.Partitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	today := dbToday(t, pool)
	for d := today; !d.After(today.AddDate(0, 0, idempotency.Ahead)); d = d.AddDate(0, 0, 1) {
		n := 0
		for _, p := range ps {
			if (p.Lower == nil || !d.Before(*p.Lower)) && d.Before(p.Upper) {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("day %s is in %d partitions, want 1: %+v", d.Format(time.DateOnly), n, ps)
		}
	}
	// Again: nothing to do.
	created, err := idempotency.EnsurePartitions(ctx, pool)
	if err != nil || len(created) != 0 {
		t.Fatalf("second EnsurePartitions created %v (%v), want none", created, err)
	}
}

// Partitions whose records have all expired (an hour's margin) go whole,
// and nothing live goes with them; a partition holding a live record, or
// one that expired less than DropMargin ago, stays.
func TestDropExpiredDropsOnlyPartitionsWhoseRecordsAllExpired(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	today := dbToday(t, pool)
	makeDayPartitions(t, pool, today)
	// Three past days, each with records expiring through it.
	for back := 1; back <= 3; back++ {
		d := today.AddDate(0, 0, -back)
		createDay(t, pool, d)
		exec(t, pool, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
			SELECT gen_random_uuid(), 'k' || g, '\x00', 202, '\x7b7d', $1::timestamptz + g * interval '1 minute'
			FROM generate_series(0, 1439) g`, d)
	}
	exec(t, pool, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
		SELECT gen_random_uuid(), 'live' || g, '\x00', 202, '\x7b7d', now() + g * interval '1 second' FROM generate_series(1, 100) g`)
	live := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE expires_at > now()`)

	dropped, err := idempotency.DropExpired(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	want := []string{dayName(today.AddDate(0, 0, -3)), dayName(today.AddDate(0, 0, -2))}
	if !today.After(now.Add(-idempotency.DropMargin)) {
		want = append(want, dayName(today.AddDate(0, 0, -1)))
	}
	if fmt.Sprint(dropped) != fmt.Sprint(want) {
		t.Fatalf("dropped %v, want %v", dropped, want)
	}
	if got := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE expires_at > now()`); got != live {
		t.Fatalf("%d live records after the drop, want %d", got, live)
	}
	if got := count(t, pool, `SELECT count(*) FROM pg_class WHERE relname = ANY($1)`, want); got != 0 {
		t.Fatalf("%d dropped partitions still exist as tables", got)
	}
}

// A DETACH CONCURRENTLY cut short (the worker killed between its two
// transactions) leaves the partition pending; the next run finishes it.
func TestMaintainFinishesAnInterruptedDetach(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	today := dbToday(t, pool)
	makeDayPartitions(t, pool, today)
	old := today.AddDate(0, 0, -2)
	createDay(t, pool, old)
	// A pending detach, as an interrupted DETACH CONCURRENTLY leaves it:
	// cancel the second phase by a transaction it must wait for.
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, `SELECT count(*) FROM idempotency_keys`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, `SET statement_timeout = '300ms'`)
	if err == nil {
		_, err = conn.Exec(ctx, fmt.Sprintf(`ALTER TABLE idempotency_keys DETACH PARTITION %s CONCURRENTLY`, dayName(old)))
	}
	conn.Release()
	_ = blocker.Rollback(ctx)
	if err == nil {
		t.Fatal("the detach was not interrupted; the test sets up nothing")
	}
	ps, err := idempotency.Partitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	pending := false
	for _, p := range ps {
		pending = pending || (p.Name == dayName(old) && p.Pending)
	}
	if !pending {
		t.Fatalf("no pending detach after the interruption: %+v", ps)
	}
	if err := idempotency.Maintain(ctx, pool, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if got := count(t, pool, `SELECT count(*) FROM pg_class WHERE relname = $1`, dayName(old)); got != 0 {
		t.Fatalf("the pending partition %s was not dropped", dayName(old))
	}
}

// makeDayPartitions drops the first partition (empty in a new test
// database) and makes the week's day partitions in its place, as a
// database has them once the first has expired.
func makeDayPartitions(t *testing.T, pool *pgxpool.Pool, today time.Time) {
	t.Helper()
	ps, err := idempotency.Partitions(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Lower == nil {
			exec(t, pool, fmt.Sprintf(`DROP TABLE %s`, p.Name))
		}
	}
	if _, err := idempotency.EnsurePartitions(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	if got := count(t, pool, `SELECT count(*) FROM pg_class WHERE relname = $1`, dayName(today)); got != 1 {
		t.Fatalf("no partition for today after EnsurePartitions")
	}
}

func createDay(t *testing.T, pool *pgxpool.Pool, d time.Time) {
	t.Helper()
	exec(t, pool, fmt.Sprintf(`CREATE TABLE %s PARTITION OF idempotency_keys FOR VALUES FROM ('%s') TO ('%s')`,
		dayName(d), d.Format(time.RFC3339), d.AddDate(0, 0, 1).Format(time.RFC3339)))
}

func dayName(d time.Time) string { return "idempotency_keys_" + d.Format("20060102") }

func dbToday(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var d time.Time
	if err := pool.QueryRow(context.Background(), `SELECT date_trunc('day', now(), 'UTC')`).Scan(&d); err != nil {
		t.Fatal(err)
	}
	return d.UTC()
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// A partition detached but not dropped (the worker killed in between) is
// no partition any more, and nothing reads it: the next run drops it.
func TestDropExpiredDropsADetachedLeftover(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	today := dbToday(t, pool)
	makeDayPartitions(t, pool, today)
	old := today.AddDate(0, 0, -2)
	createDay(t, pool, old)
	exec(t, pool, fmt.Sprintf(`ALTER TABLE idempotency_keys DETACH PARTITION %s`, dayName(old)))
	dropped, err := idempotency.DropExpired(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(dropped) != fmt.Sprint([]string{dayName(old)}) {
		t.Fatalf("dropped %v, want the leftover %s", dropped, dayName(old))
	}
	if got := count(t, pool, `SELECT count(*) FROM pg_class WHERE relname = $1`, dayName(old)); got != 0 {
		t.Fatalf("the leftover %s was not dropped", dayName(old))
	}
}

// The compressed layout of bench/expiry.sh (the development build's
// OVERAGE_DEV_IDEMPOTENCY_WIDTH=1m): the same Maintain on minute-wide
// partitions drops each one whose records all expired DropMargin ago,
// and a detached leftover of that width, never a partition holding a live
// record, and keeps Ahead minutes ready.
func TestCompressedMaintainDropsEachWhollyExpiredMinute(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	c := idempotency.Compressed(time.Minute)
	if c.TTL() != time.Minute || c.DropMargin() != 5*time.Second || c.Ahead() != idempotency.Ahead {
		t.Fatalf("compressed layout: TTL %v, margin %v, ahead %d", c.TTL(), c.DropMargin(), c.Ahead())
	}
	// The first partition (empty, spanning days) goes, as bench/expiry.sh
	// drops it, so the minutes are not covered by it.
	ps, err := idempotency.Partitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Lower == nil {
			exec(t, pool, fmt.Sprintf(`DROP TABLE %s`, p.Name))
		}
	}
	if _, err := c.EnsurePartitions(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var cur time.Time
	if err := pool.QueryRow(ctx, `SELECT date_bin('1 minute', now(), timestamptz '2000-01-01 00:00:00+00')`).Scan(&cur); err != nil {
		t.Fatal(err)
	}
	cur = cur.UTC()
	// Four past minutes full of expired records, and a fifth detached and
	// left behind (a crash between detach and drop).
	minute := func(back int) time.Time { return cur.Add(-time.Duration(back) * time.Minute) }
	for back := 1; back <= 5; back++ {
		lower := minute(back)
		exec(t, pool, fmt.Sprintf(`CREATE TABLE %s PARTITION OF idempotency_keys FOR VALUES FROM ('%s') TO ('%s')`,
			c.Name(lower), lower.Format(time.RFC3339), lower.Add(time.Minute).Format(time.RFC3339)))
		exec(t, pool, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
			SELECT gen_random_uuid(), 'k' || g, '\x00', 202, '\x7b7d', $1::timestamptz + g * interval '1 second'
			FROM generate_series(0, 59) g`, lower)
	}
	exec(t, pool, fmt.Sprintf(`ALTER TABLE idempotency_keys DETACH PARTITION %s`, c.Name(minute(5))))
	// Live records through the next TTL, and in the current minute some
	// already expired beside them: that partition holds live ones, so stays.
	exec(t, pool, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
		SELECT gen_random_uuid(), 'live' || g, '\x00', 202, '\x7b7d', now() + g * interval '1 second' FROM generate_series(1, 60) g`)
	exec(t, pool, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
		VALUES (gen_random_uuid(), 'expired-now', '\x00', 202, '\x7b7d', $1)`, cur)
	live := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE expires_at > now()`)

	var before, after time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if err := c.Maintain(ctx, pool, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	exists := func(name string) bool {
		return count(t, pool, `SELECT count(*) FROM pg_class WHERE relname = $1`, name) == 1
	}
	for back := 2; back <= 5; back++ {
		if exists(c.Name(minute(back))) {
			t.Errorf("%s, expired %v ago, was not dropped", c.Name(minute(back)), before.Sub(minute(back).Add(time.Minute)))
		}
	}
	// The last minute's records all expired at cur: it goes once the
	// margin has passed, and not before.
	switch last := c.Name(minute(1)); {
	case !cur.After(before.Add(-c.DropMargin())) && exists(last):
		t.Errorf("%s, expired %v ago, was not dropped", last, before.Sub(cur))
	case cur.After(after.Add(-c.DropMargin())) && !exists(last):
		t.Errorf("%s, expired %v ago, within the margin, was dropped", last, after.Sub(cur))
	}
	if !exists(c.Name(cur)) {
		t.Errorf("the current minute's partition %s, holding live records, was dropped", c.Name(cur))
	}
	if got := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE expires_at > now()`); got != live {
		t.Fatalf("%d live records after Maintain, want %d", got, live)
	}
	// Every minute from now to Ahead beyond in exactly one partition.
	ps, err = idempotency.Partitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for d := cur; !d.After(cur.Add(time.Duration(c.Ahead()) * time.Minute)); d = d.Add(time.Minute) {
		n := 0
		for _, p := range ps {
			if (p.Lower == nil || !d.Before(*p.Lower)) && d.Before(p.Upper) {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("minute %s is in %d partitions, want 1: %+v", d.Format(time.TimeOnly), n, ps)
		}
	}
}

// A drop that fails must not keep the partitions ahead from being made:
// ingest fails without them, while an expired partition left behind only
// waits for the next run. A detached leftover a view depends on cannot be
// dropped; the last day ahead, removed, must come back all the same.
func TestMaintainMakesThePartitionsAheadWhenADropFails(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	today := dbToday(t, pool)
	makeDayPartitions(t, pool, today)
	last := today.AddDate(0, 0, idempotency.Ahead)
	exec(t, pool, fmt.Sprintf(`ALTER TABLE idempotency_keys DETACH PARTITION %s`, dayName(last)))
	exec(t, pool, fmt.Sprintf(`DROP TABLE %s`, dayName(last)))
	old := today.AddDate(0, 0, -2)
	createDay(t, pool, old)
	exec(t, pool, fmt.Sprintf(`ALTER TABLE idempotency_keys DETACH PARTITION %s`, dayName(old)))
	exec(t, pool, fmt.Sprintf(`CREATE VIEW keeps_the_leftover AS SELECT * FROM %s`, dayName(old)))
	if err := idempotency.Maintain(context.Background(), pool, slog.Default()); err == nil {
		t.Fatal("Maintain reported no error though the leftover could not be dropped")
	}
	if got := count(t, pool, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency_keys'::regclass AND inhrelid = to_regclass($1)`, dayName(last)); got != 1 {
		t.Fatalf("the day ahead %s was not made again after the failed drop", dayName(last))
	}
}

// Two runs at once (two `work` replicas, or a run River started again
// while the last still waits on a long transaction) do not race to detach
// the same partition: the second finds the first in progress and skips,
// without an error, and each expired partition is detached and dropped
// exactly once.
func TestConcurrentMaintainDropsEachExpiredPartitionOnce(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	today := dbToday(t, pool)
	makeDayPartitions(t, pool, today)
	var expired []string
	for back := 2; back <= 4; back++ {
		createDay(t, pool, today.AddDate(0, 0, -back))
		expired = append(expired, dayName(today.AddDate(0, 0, -back)))
	}
	// A transaction that read the table: the first run's DETACH …
	// CONCURRENTLY waits for it, so the second starts while the first is
	// in the middle of its drops.
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(ctx) }()
	if _, err := blocker.Exec(ctx, `SELECT count(*) FROM idempotency_keys`); err != nil {
		t.Fatal(err)
	}
	var firstLogs, secondLogs bytes.Buffer
	first := make(chan error, 1)
	go func() {
		first <- idempotency.Maintain(ctx, pool, slog.New(slog.NewJSONHandler(&firstLogs, nil)))
	}()
	waitFor(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'
			  AND query LIKE 'ALTER TABLE idempotency_keys DETACH PARTITION%'`) == 1
	}, "the first run's detach to wait for the open transaction")

	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := idempotency.Maintain(sctx, pool, slog.New(slog.NewJSONHandler(&secondLogs, nil))); err != nil {
		t.Fatalf("the second run, beside the first: %v", err)
	}
	if out := secondLogs.String(); !strings.Contains(out, "another maintenance run is in progress") || strings.Contains(out, "dropped") {
		t.Fatalf("the second run did not skip: %s", out)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first run: %v", err)
	}
	for _, name := range expired {
		n := strings.Count(firstLogs.String()+secondLogs.String(), `"partition":"`+name+`"`)
		if n != 1 {
			t.Errorf("%s reported dropped %d times, want once: %s", name, n, firstLogs.String())
		}
		if got := count(t, pool, `SELECT count(*) FROM pg_class WHERE relname = $1`, name); got != 0 {
			t.Errorf("the expired partition %s is still there", name)
		}
	}
	// The lock is released with the run: the next one runs (and has
	// nothing left to drop).
	var next bytes.Buffer
	if err := idempotency.Maintain(ctx, pool, slog.New(slog.NewJSONHandler(&next, nil))); err != nil || strings.Contains(next.String(), "skipped") {
		t.Fatalf("the run after both: %v, %s", err, next.String())
	}
}

// waitFor polls cond until it holds, failing t after 30 seconds.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A new database's first partition spans the days to three ahead of its
// migration: while it holds no record, FitFirstPartition ends it where the
// current day begins and makes the days from there, so a record written
// now goes to its expiry day's partition; a second run does nothing. A
// first partition that holds a record stays as it is — also one whose
// record's transaction was still open when the fit came: the fit waits
// for it behind its lock, then finds the record.
func TestFitFirstPartitionEndsAnEmptyFirstPartitionAtToday(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	insert := `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
		VALUES (gen_random_uuid(), 'k', '\x00', 202, '\x7b7d', now() + interval '24 hours')`
	where := `SELECT tableoid::regclass::text FROM idempotency_keys`

	pool, _ := pgtest.NewPool(t)
	today := dbToday(t, pool)
	before, err := idempotency.Partitions(ctx, pool)
	if err != nil || before[0].Lower != nil || !before[0].Upper.After(today.AddDate(0, 0, 1)) {
		t.Fatalf("a new database's first partition: %+v (%v); want one spanning days ahead", before, err)
	}
	fitted, created, err := idempotency.FitFirstPartition(ctx, pool)
	if err != nil || !fitted || len(created) == 0 {
		t.Fatalf("fit = %v, created %v, %v; want the first partition ended and days made", fitted, created, err)
	}
	ps, err := idempotency.Partitions(ctx, pool)
	if err != nil || ps[0].Name != before[0].Name || ps[0].Lower != nil || !ps[0].Upper.Equal(today) {
		t.Fatalf("first partition after the fit: %+v (%v); want it ending at %v", ps[0], err, today)
	}
	for i, p := range ps[1:] {
		if p.Lower == nil || !p.Lower.Equal(ps[i].Upper) {
			t.Fatalf("partition %+v does not follow %+v", p, ps[i])
		}
	}
	if last := ps[len(ps)-1]; !last.Upper.Equal(today.AddDate(0, 0, idempotency.Ahead+1)) {
		t.Fatalf("last partition %+v; want the days to %d ahead", last, idempotency.Ahead)
	}
	exec(t, pool, insert)
	var got string
	if err := pool.QueryRow(ctx, where).Scan(&got); err != nil || got != dayName(today.AddDate(0, 0, 1)) {
		t.Fatalf("a record expiring tomorrow went to %s (%v), want %s", got, err, dayName(today.AddDate(0, 0, 1)))
	}
	if fitted, created, err := idempotency.FitFirstPartition(ctx, pool); err != nil || fitted || len(created) != 0 {
		t.Fatalf("second fit = %v, created %v, %v; want nothing", fitted, created, err)
	}

	// A record in the first partition, its transaction open as the fit
	// comes: the fit waits, and leaves the partition with it as it is.
	held, _ := pgtest.NewPool(t)
	tx, err := held.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, insert); err != nil {
		t.Fatal(err)
	}
	type fit struct {
		fitted bool
		err    error
	}
	done := make(chan fit, 1)
	go func() {
		fitted, _, err := idempotency.FitFirstPartition(ctx, held)
		done <- fit{fitted, err}
	}()
	waitFor(t, func() bool {
		return count(t, held, `SELECT count(*) FROM pg_locks WHERE NOT granted AND mode = 'AccessExclusiveLock'
			AND relation = 'idempotency_keys_legacy'::regclass`) == 1
	}, "the fit to wait for the open transaction's lock")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.fitted {
		t.Fatalf("fit over a committed record = %v, %v; want no fit", r.fitted, r.err)
	}
	after, err := idempotency.Partitions(ctx, held)
	if err != nil || after[0].Lower != nil || !after[0].Upper.After(today.AddDate(0, 0, 1)) {
		t.Fatalf("first partition holding a record: %+v (%v); want it left spanning days ahead", after[0], err)
	}
	if got := count(t, held, `SELECT count(*) FROM idempotency_keys_legacy`); got != 1 {
		t.Fatalf("first partition holds %d records, want the 1 committed", got)
	}
}
