package partitions_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/webhooks/partitions"
)

// A DETACH CONCURRENTLY cut short (the worker killed between its two
// transactions) leaves the partition pending, and a crash between detach
// and drop leaves a plain table: the next run finishes both, but keeps a
// leftover that holds an unprocessed event.
func TestDropExpiredFinishesInterruptedDetachesAndKeepsWhatIsOwed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	day := 24 * time.Hour
	ps := repartition(t, pool, now.Add(-420*day), now.Add(-400*day), now.Add(-380*day))
	pending, leftover, owed := ps[0].Name, ps[1].Name, ps[2].Name
	if !ps[2].Upper.Before(now.Add(-370 * day)) {
		t.Fatalf("partitions %+v: want three wholly past retention first", ps[:3])
	}
	exec(t, pool, fmt.Sprintf(`INSERT INTO %s (event_id, account, type, payload, received_at) VALUES ('evt_owed', 'platform', 'x', '{}', $1)`, owed), *ps[2].Lower)

	// Pending: the second phase of the detach cancelled while a
	// transaction it must wait for reads the table.
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, `SELECT count(*) FROM stripe_webhook_events`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, `SET statement_timeout = '300ms'`)
	if err == nil {
		_, err = conn.Exec(ctx, fmt.Sprintf(`ALTER TABLE stripe_webhook_events DETACH PARTITION %s CONCURRENTLY`, pending))
	}
	conn.Release()
	_ = blocker.Rollback(ctx)
	if err == nil {
		t.Fatal("the detach was not interrupted; the test sets up nothing")
	}
	after, err := partitions.Partitions(ctx, pool)
	if err != nil || after[0].Name != pending || !after[0].Pending {
		t.Fatalf("partitions %+v (%v): want %s pending detach after the interruption", after[:1], err, pending)
	}
	// Leftovers: detached, not dropped.
	exec(t, pool, fmt.Sprintf(`ALTER TABLE stripe_webhook_events DETACH PARTITION %s`, leftover))
	exec(t, pool, fmt.Sprintf(`ALTER TABLE stripe_webhook_events DETACH PARTITION %s`, owed))

	res, err := partitions.DropExpired(ctx, pool, 365*day)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{pending, leftover} {
		if !slices.Contains(res.Dropped, name) {
			t.Errorf("%s not dropped: %+v", name, res)
		}
		if n := count(t, pool, `SELECT count(*) FROM pg_class WHERE relname = $1`, name); n != 0 {
			t.Errorf("%s still exists", name)
		}
	}
	if slices.Contains(res.Dropped, owed) || len(res.Kept) != 1 || res.Kept[0].Name != owed || res.Kept[0].Unprocessed != 1 {
		t.Fatalf("%+v: want %s kept with its unprocessed event", res, owed)
	}
	if n := count(t, pool, fmt.Sprintf(`SELECT count(*) FROM %s`, owed)); n != 1 {
		t.Fatalf("the kept leftover holds %d events, want its 1", n)
	}
}

// repartition drops every partition (all empty in a new test database),
// makes them again with a bound at each of uppers, the first from
// MINVALUE, then the months ahead, and returns them.
func repartition(t *testing.T, pool *pgxpool.Pool, uppers ...time.Time) []partitions.Partition {
	t.Helper()
	ctx := context.Background()
	ps, err := partitions.Partitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		exec(t, pool, fmt.Sprintf(`DROP TABLE %s`, p.Name))
	}
	for _, u := range uppers {
		for {
			name, err := partitions.Add(ctx, pool, u)
			if err != nil {
				t.Fatal(err)
			}
			if name == "" {
				break
			}
		}
	}
	if _, err := partitions.Ensure(ctx, pool); err != nil {
		t.Fatal(err)
	}
	ps, err = partitions.Partitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	return ps
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
