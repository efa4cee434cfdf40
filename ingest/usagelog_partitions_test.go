package ingest_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/parttest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/usagelog"
)

func partitionedService(t *testing.T) (*pgxpool.Pool, *ingest.Service, uuid.UUID) {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	tenant := uuid.New()
	if _, err := pool.Exec(context.Background(), `INSERT INTO tenants (id, name, stripe_customer_id, included_input_tokens, included_output_tokens)
		VALUES ($1, 'alice', 'cus_alice', 0, 0)`, tenant); err != nil {
		t.Fatal(err)
	}
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return pool, ingest.NewService(pool, outbox.NewInserter(rc, 5)), tenant
}

// A request_id recorded 20 days ago, in last month's partition, is a
// duplicate of the event sent again now: the lookup reads every partition
// a replay's original can be in, not only the current one.
func TestDuplicateRequestIDFoundInAnOlderPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, svc, tenant := partitionedService(t)
	now := time.Now().UTC()
	parttest.Repartition(t, pool, parttest.Month(now, -3), parttest.Month(now, -2), parttest.Month(now, -1), parttest.Month(now, 0),
		parttest.Month(now, 1), parttest.Month(now, 2))
	at := now.Add(-20 * 24 * time.Hour).Truncate(time.Microsecond)
	if at.After(parttest.Month(now, 0)) {
		at = parttest.Month(now, 0).Add(-time.Hour) // early in a month: last month's last hour
	}
	old := usagelog.IDFloor(at)
	old[6], old[8], old[15] = 0x70, 0x80, 0x01
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status, created_at)
		VALUES ($1, $2, 'then', $3, 'u', 'm', 5, 5, date_trunc('month', $3::timestamptz, 'UTC'), 5, 5, 'pending', $3)`, old, tenant, at); err != nil {
		t.Fatal(err)
	}
	var where string
	if err := pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM usage_logs WHERE id = $1`, old).Scan(&where); err != nil ||
		where != "usage_logs_p"+parttest.Month(at, 0).Format("200601") {
		t.Fatalf("the old log is in %q (%v)", where, err)
	}
	rid := "then"
	out, err := svc.Record(ctx, ingest.RecordParams{TenantID: tenant, Key: "again", Fingerprint: []byte("again"),
		Event: &ingest.Event{RequestID: &rid, Timestamp: at, UserID: "u", ModelID: "m", InputTokens: 5, OutputTokens: 5}})
	if err != nil || out.Kind != ingest.OutcomeDuplicate || out.UsageLogID != old {
		t.Fatalf("the request_id of a log in %s sent again: %+v, %v; want a duplicate of %s", where, out, err, old)
	}
	var logs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE request_id = 'then'`).Scan(&logs); err != nil || logs != 1 {
		t.Fatalf("%d logs of the request_id (%v)", logs, err)
	}
}

// Two transactions record one request_id on either side of a partition
// bound: the first mints its log's id before the bound and is held after
// its reads; the second, sent once the bound has passed, mints its id
// after it, reads no log either (the first has not committed), and is
// held too; then both go on. The two logs would land in two partitions
// whose unique indexes never meet: the claim near the bound referees, the
// second fails at it once the first commits, and its retry answers the
// first one's log as a duplicate. Exactly one log.
func TestConcurrentDuplicatesAcrossAPartitionBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, svc, tenant := partitionedService(t)
	// Two app servers (a service coalesces one tenant's events into
	// transactions one after another): each sends one of the two.
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	other := ingest.NewService(pool, outbox.NewInserter(rc, 5))
	now := time.Now().UTC()
	bound := now.Add(1500 * time.Millisecond).Truncate(time.Millisecond)
	names := parttest.Repartition(t, pool, parttest.Month(now, -1), bound, parttest.Month(now, 2))
	var mu sync.Mutex
	entered := 0
	open := make(chan struct{})
	hold := func(ctx context.Context) error {
		mu.Lock()
		entered++
		mu.Unlock()
		select {
		case <-open:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ingest.SetBeforeWrites(svc, hold)
	ingest.SetBeforeWrites(other, hold)
	held := func() int {
		mu.Lock()
		defer mu.Unlock()
		return entered
	}
	rid := "across"
	type answer struct {
		out *ingest.Outcome
		err error
	}
	send := func(svc *ingest.Service, key string) chan answer {
		ch := make(chan answer, 1)
		go func() {
			out, err := svc.Record(ctx, ingest.RecordParams{TenantID: tenant, Key: key, Fingerprint: []byte(key),
				Event: &ingest.Event{RequestID: &rid, Timestamp: time.Now().UTC().Truncate(time.Microsecond), UserID: "u", ModelID: "m",
					InputTokens: 1, OutputTokens: 1}})
			ch <- answer{out, err}
		}()
		return ch
	}
	first := send(svc, "first")
	polltest.Until(t, "the first transaction held after its reads", 20*time.Second, func() bool { return held() == 1 })
	polltest.Until(t, "the bound passed", 20*time.Second, func() bool { return time.Now().After(bound.Add(10 * time.Millisecond)) })
	second := send(other, "second")
	polltest.Until(t, "the second transaction held after its reads", 20*time.Second, func() bool { return held() == 2 })
	close(open)
	a, b := <-first, <-second
	if a.err != nil || b.err != nil {
		t.Fatalf("answers %+v (%v), %+v (%v)", a.out, a.err, b.out, b.err)
	}
	kinds := []string{a.out.Kind, b.out.Kind}
	if !(slices.Equal(kinds, []string{ingest.OutcomeNew, ingest.OutcomeDuplicate}) || slices.Equal(kinds, []string{ingest.OutcomeDuplicate, ingest.OutcomeNew})) ||
		a.out.UsageLogID != b.out.UsageLogID {
		t.Errorf("answers %s %s and %s %s; want one new log and its duplicate", a.out.Kind, a.out.UsageLogID, b.out.Kind, b.out.UsageLogID)
	}
	var logs int
	var where []string
	rows, err := pool.Query(ctx, `SELECT tableoid::regclass::text FROM usage_logs WHERE tenant_id = $1 AND request_id = $2`, tenant, rid)
	if err == nil {
		where, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if logs = len(where); err != nil || logs != 1 {
		t.Fatalf("%d logs of the request_id, in %v (%v); want one", logs, where, err)
	}
	// Which one won is the race's; the loser's id was on the other side.
	if where[0] != names[0] && where[0] != names[1] {
		t.Errorf("the log is in %s", where[0])
	}
}
