package ingest_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
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

// A request_id is deduplicated for as long as its log is kept: a log
// recorded more than 40 days ago, in a partition older than the one of
// 36 days ago (made before migration 0061, so with its unique index on the
// request_id itself), answers a new, different event reusing its
// request_id as a duplicate (200), alone or in a batch; nothing new is
// recorded under it.
func TestRequestIDOlderThanTheReplayHorizonIsStillADuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, svc, tenant := partitionedService(t)
	now := time.Now().UTC()
	names := parttest.Repartition(t, pool, parttest.Month(now, -4), parttest.Month(now, -3), parttest.Month(now, -2), parttest.Month(now, -1),
		parttest.Month(now, 0), parttest.Month(now, 1), parttest.Month(now, 2))
	// Before the partition of ReplayHorizon ago (what the lookups read
	// before), and more than 40 days ago.
	at := parttest.Month(now.Add(-usagelog.ReplayHorizon), 0).Add(-24 * time.Hour)
	if limit := now.Add(-45 * 24 * time.Hour); at.After(limit) {
		at = limit
	}
	at = at.Truncate(time.Microsecond)
	old := usagelog.IDFloor(at)
	old[6], old[8], old[15] = 0x70, 0x80, 0x01
	where := "usage_logs_p" + parttest.Month(at, 0).Format("200601")
	if !slices.Contains(names, where) {
		t.Fatalf("no partition %s of the old log in %v", where, names)
	}
	parttest.Reindex(t, pool, where, parttest.RequestIDIndex)
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status, created_at)
		VALUES ($1, $2, 'long-ago', $3, 'u', 'm', 5, 5, date_trunc('month', $3::timestamptz, 'UTC'), 5, 5, 'pending', $3)`, old, tenant, at); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM usage_logs WHERE id = $1`, old).Scan(&got); err != nil || got != where {
		t.Fatalf("the old log is in %q (%v), want %s", got, err, where)
	}
	logs := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE tenant_id = $1`, tenant).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	rid, fresh := "long-ago", "fresh"
	// Another event: now, other tokens.
	out, err := svc.Record(ctx, ingest.RecordParams{TenantID: tenant, Key: "single", Fingerprint: []byte("single"),
		Event: &ingest.Event{RequestID: &rid, Timestamp: now.Truncate(time.Microsecond), UserID: "u2", ModelID: "m", InputTokens: 7, OutputTokens: 9}})
	if err != nil || out.Kind != ingest.OutcomeDuplicate || out.Status != 200 || out.UsageLogID != old {
		t.Fatalf("a new event under the request_id of a log of %v in %s: %v; want a 200 duplicate of %s", at, where, describe(out, err), old)
	}
	if n := logs(); n != 1 {
		t.Fatalf("%d logs after the single event, want the old one alone", n)
	}
	out, err = svc.RecordBatch(ctx, ingest.BatchParams{TenantID: tenant, Key: "batch", Fingerprint: []byte("batch"), Events: []*ingest.Event{
		{RequestID: &fresh, Timestamp: now.Truncate(time.Microsecond), UserID: "u", ModelID: "m", InputTokens: 1, OutputTokens: 1},
		{RequestID: &rid, Timestamp: now.Truncate(time.Microsecond), UserID: "u3", ModelID: "m", InputTokens: 3, OutputTokens: 3},
	}})
	if err != nil || out.Status != 202 {
		t.Fatalf("a batch reusing the request_id: %+v, %v", out, err)
	}
	var ids []uuid.UUID
	rows, err := pool.Query(ctx, `SELECT id FROM usage_logs WHERE tenant_id = $1 AND request_id = 'long-ago'`, tenant)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]); err != nil || !slices.Equal(ids, []uuid.UUID{old}) || logs() != 2 {
		t.Fatalf("after the batch: logs of the request_id %v (%v), %d logs in all; want the old one alone and the fresh one", ids, err, logs())
	}
	if !strings.Contains(string(out.Body), `"duplicates":1`) {
		t.Errorf("the batch's answer: %s; want one duplicate", out.Body)
	}
}

// describe is an outcome's status, kind and log, or its error.
func describe(out *ingest.Outcome, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d %s %s", out.Status, out.Kind, out.UsageLogID)
}

// Logs in partitions of each shape of unique index on request_id — on the
// request_id itself (before 0061), on its digest beside the tenant (0061),
// on the digest of both (since 0067) — are found by one lookup: a batch
// reusing their request_ids answers each as a duplicate of its log and
// records only its new one, and a single event under each is a duplicate
// too.
func TestDuplicatesAcrossPartitionsOfEveryIndexShape(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, svc, tenant := partitionedService(t)
	now := time.Now().UTC()
	names := parttest.Repartition(t, pool, parttest.Month(now, -3), parttest.Month(now, -2), parttest.Month(now, -1), parttest.Month(now, 0),
		parttest.Month(now, 2))
	parttest.Reindex(t, pool, names[0], parttest.RequestIDIndex)
	parttest.Reindex(t, pool, names[1], parttest.DigestIndex)
	rids := []string{"keyed", "digested", "newer"}
	olds := map[string]uuid.UUID{}
	for i, rid := range rids {
		at := parttest.Month(now, i-3).Add(24 * time.Hour).Truncate(time.Microsecond)
		id := usagelog.IDFloor(at)
		id[6], id[8], id[15] = 0x70, 0x80, byte(i+1)
		if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
				period_start, overage_input_tokens, overage_output_tokens, billing_status, created_at)
			VALUES ($1, $2, $3, $4, 'u', 'm', 5, 5, date_trunc('month', $4::timestamptz, 'UTC'), 5, 5, 'pending', $4)`, id, tenant, rid, at); err != nil {
			t.Fatal(err)
		}
		olds[rid] = id
	}
	event := func(rid string) *ingest.Event {
		return &ingest.Event{RequestID: &rid, Timestamp: now.Truncate(time.Microsecond), UserID: "u", ModelID: "m", InputTokens: 1, OutputTokens: 1}
	}
	logsOf := func(rid string) []string {
		rows, err := pool.Query(ctx, `SELECT tableoid::regclass::text FROM usage_logs WHERE tenant_id = $1 AND request_id = $2`, tenant, rid)
		if err != nil {
			t.Fatal(err)
		}
		where, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return where
	}
	out, err := svc.RecordBatch(ctx, ingest.BatchParams{TenantID: tenant, Key: "batch", Fingerprint: []byte("batch"),
		Events: []*ingest.Event{event("keyed"), event("fresh"), event("digested"), event("newer")}})
	if err != nil {
		t.Fatal(err)
	}
	if out.Status != 202 || !strings.Contains(string(out.Body), `"duplicates":3`) {
		t.Fatalf("a batch reusing a request_id of each partition: %d %s; want three duplicates", out.Status, out.Body)
	}
	for i, rid := range rids {
		if where := logsOf(rid); !slices.Equal(where, []string{names[i]}) {
			t.Errorf("logs of %s in %v; want the one in %s", rid, where, names[i])
		}
		out, err := svc.Record(ctx, ingest.RecordParams{TenantID: tenant, Key: "single-" + rid, Fingerprint: []byte(rid), Event: event(rid)})
		if err != nil || out.Kind != ingest.OutcomeDuplicate || out.UsageLogID != olds[rid] {
			t.Errorf("a single event under %s (its log in %s): %v; want a duplicate of %s", rid, names[i], describe(out, err), olds[rid])
		}
	}
	if where := logsOf("fresh"); len(where) != 1 || where[0] != names[3] {
		t.Errorf("the fresh event's logs in %v; want one in %s", where, names[3])
	}
}
