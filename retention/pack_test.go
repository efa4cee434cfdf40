package retention_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
	"github.com/overage-billing/overage/internal/testkit/retentiontest"
	"github.com/overage-billing/overage/retention"
	"github.com/overage-billing/overage/usagelog"
)

// seedMany writes n logs of tenant minted in [from, from+span), with
// request_ids, in random order of id (as concurrent ingest leaves a
// month's indexes: leaves split in the middle), pending, then gives them
// status as billing does, by updates that are not HOT (a new entry in
// every index for each), and returns their ids and request_ids.
func seedMany(t *testing.T, pool *pgxpool.Pool, tenant uuid.UUID, from time.Time, span time.Duration, n int, status string) ([]uuid.UUID, []string) {
	t.Helper()
	ids := make([]uuid.UUID, n)
	reqs := make([]string, n)
	for i := range ids {
		ids[i] = retentiontest.ID(from.Add(time.Duration(rand.Int64N(int64(span)))))
		reqs[i] = fmt.Sprintf("req-%s", uuid.NewString())
	}
	if _, err := pool.Exec(context.Background(), `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id,
			input_tokens, output_tokens, period_start, billing_status, created_at)
		SELECT x.id, $2, x.r, $3, 'u', 'm', 10, 1, date_trunc('month', $3::timestamptz, 'UTC'), 'pending', $3
		FROM unnest($1::uuid[], $4::text[]) AS x(id, r)`, ids, tenant, from, reqs); err != nil {
		t.Fatalf("seed logs: %v", err)
	}
	if status != "pending" {
		if _, err := pool.Exec(context.Background(), `UPDATE usage_logs SET billing_status = $2, billed_at = now() WHERE id = ANY($1)`, ids, status); err != nil {
			t.Fatalf("bill the seeded logs: %v", err)
		}
	}
	return ids, reqs
}

func indexBytes(t *testing.T, pool *pgxpool.Pool, table string) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT pg_indexes_size($1::regclass)`, table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A kept partition whose month is over and whose logs are all billed is
// packed by retention, once: every index of its logs and its reports
// rebuilt at fillfactor 100, still valid and attached to the parent's
// index, the primary key and the request_id rule still enforced, smaller
// than before; a leftover of an interrupted REINDEX CONCURRENTLY is
// dropped. A dry run says "would pack" and changes nothing; a partition
// with a pending log and the current month are left as they are; a run
// packs one partition, the next the next one due, and none again.
func TestRetentionPacksAMonthOnceNothingWritesIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	names := retentiontest.Replace(t, pool, jan, feb, mar, apr)
	tenant := newTenants(t, pool, 1)[0]
	ids, reqs := seedMany(t, pool, tenant, jan, 27*24*time.Hour, 20000, "billed")
	seedMany(t, pool, tenant, feb, 27*24*time.Hour, 100, "pending")
	seedMany(t, pool, tenant, mar, 27*24*time.Hour, 100, "not_billable")
	// An interrupted REINDEX CONCURRENTLY's leftover: an invalid index
	// of the month, which every write still updates.
	leftover := names[0] + "_tenant_id_ccnew"
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE UNIQUE INDEX CONCURRENTLY %s ON %s (tenant_id)`, leftover, names[0])); err == nil {
		t.Fatal("a unique index on one tenant's logs was built")
	}
	before := pgtest.Indexes(t, pool, names[0])
	if _, ok := before[leftover]; !ok {
		t.Fatalf("no leftover index: %v", before)
	}
	bytesBefore := indexBytes(t, pool, names[0])
	heapBefore := pgtest.TableBytes(t, pool, names[0])
	contentBefore := pgtest.RowsDigest(t, pool, names[0])
	keep := retention.Config{Retention: 0}

	res := run(t, pool, keep, true)
	if d := decisionOf(t, res, names[0]); d.Indexes != retention.PackingDue || d.PackedAt != nil {
		t.Errorf("dry run: %s: %+v", names[0], d)
	}
	if d := decisionOf(t, res, names[1]); d.Indexes != retention.PackingPending {
		t.Errorf("dry run: %s (a pending log): %+v", names[1], d)
	}
	if n := indexBytes(t, pool, names[0]); n != bytesBefore {
		t.Errorf("the dry run changed the indexes: %d bytes, were %d", n, bytesBefore)
	}

	res = run(t, pool, keep, false)
	d := decisionOf(t, res, names[0])
	if d.Indexes != retention.PackingPacked || d.PackedAt == nil || d.IndexBytes == nil {
		t.Fatalf("%s not packed: %+v%s", names[0], d, decisions(res))
	}
	after := indexBytes(t, pool, names[0])
	if d.IndexBytes[1] >= d.IndexBytes[0] || after*10 > bytesBefore*6 {
		t.Errorf("packing saved too little: the run says %v, the partition's indexes %d bytes, were %d", *d.IndexBytes, after, bytesBefore)
	}
	t.Logf("%s: indexes %d bytes before, %d after (the run: %v)", names[0], bytesBefore, after, *d.IndexBytes)
	// Every log was updated once, not HOT: half the heap is dead
	// versions, which the rewrite leaves behind.
	heapAfter := pgtest.TableBytes(t, pool, names[0])
	if d.HeapBytes == nil || d.HeapBytes[0] != heapBefore || d.HeapBytes[1] != heapAfter || heapAfter*10 > heapBefore*6 {
		t.Errorf("the heap: %d bytes before, %d after; the run says %v", heapBefore, heapAfter, d.HeapBytes)
	}
	if got := pgtest.RowsDigest(t, pool, names[0]); got != contentBefore {
		t.Errorf("the month's logs changed in the pack: %s, were %s", got, contentBefore)
	}

	got := pgtest.Indexes(t, pool, names[0])
	if _, ok := got[leftover]; ok || len(got) != len(before)-1 {
		t.Errorf("indexes after packing: %v\nbefore: %v", got, before)
	}
	for name, ix := range got {
		wantParent := name != names[0]+"_request_key" // unique per partition: no parent index
		if !(ix.Options == "fillfactor=100" && ix.Valid) && name != names[0]+"_ts_idx" || wantParent && ix.Parent == "" {
			t.Errorf("index %s after packing: %+v", name, ix)
		}
	}
	for name, ix := range pgtest.Indexes(t, pool, names[1]) {
		if ix.Options != "" && name != names[1]+"_ts_idx" {
			t.Errorf("%s (pending logs) was packed: %s %+v", names[1], name, ix)
		}
	}
	if reps := pgtest.Indexes(t, pool, res.Partitions[0].Reports); len(reps) == 0 {
		t.Errorf("no index on %s", res.Partitions[0].Reports)
	} else {
		for name, ix := range reps {
			if ix.Options != "fillfactor=100" || !ix.Valid || ix.Parent == "" {
				t.Errorf("reports index %s after packing: %+v", name, ix)
			}
		}
	}
	var logs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE id = ANY($1)`, ids).Scan(&logs); err != nil || logs != len(ids) {
		t.Errorf("logs found by id after packing: %d of %d (%v)", logs, len(ids), err)
	}
	_, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, billing_status) VALUES ($1, $2, $3, $4, 'u', 'm', 1, 1, $5, 'billed')`,
		retentiontest.ID(jan.Add(time.Hour)), tenant, reqs[7], jan.Add(time.Hour), jan)
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "23505" || pgErr.ConstraintName != names[0]+"_request_key" {
		t.Errorf("a request_id again in the packed month: %v", err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, billing_status) VALUES ($1, $2, $3, 'u', 'm', 1, 1, $4, 'billed')`, ids[3], tenant, jan.Add(time.Hour), jan)
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "23505" || pgErr.ConstraintName != names[0]+"_pkey" {
		t.Errorf("a log's id again in the packed month: %v", err)
	}
	var recorded time.Time
	var heapRecorded int64
	if err := pool.QueryRow(ctx, `SELECT packed_at, heap_bytes_after FROM usage_log_packs WHERE partition = $1`, names[0]).Scan(&recorded, &heapRecorded); err != nil ||
		!recorded.Equal(*d.PackedAt) || heapRecorded != heapAfter {
		t.Errorf("usage_log_packs: %v %d %v, the run said %v", recorded, heapRecorded, err, d.PackedAt)
	}
	if d := res.Partitions[len(res.Partitions)-1]; d.Indexes != retention.PackingOpen {
		t.Errorf("the last month: %+v", d)
	}
	if _, _, packed, _ := res.Summary(); packed != 1 {
		t.Errorf("the run's summary says %d packed%s", packed, decisions(res))
	}
	// One a run: the next month due waits for the next run.
	if d := decisionOf(t, res, names[2]); d.Indexes != retention.PackingDue {
		t.Errorf("%s, due after the one this run packed: %+v", names[2], d)
	}

	res = run(t, pool, keep, false)
	if d := decisionOf(t, res, names[0]); d.Indexes != retention.PackingPacked || d.IndexBytes != nil || !d.PackedAt.Equal(recorded) {
		t.Errorf("the second run: %+v", d)
	}
	if d := decisionOf(t, res, names[2]); d.Indexes != retention.PackingPacked || d.IndexBytes == nil {
		t.Errorf("the second run: %s: %+v", names[2], d)
	}
	if n := indexBytes(t, pool, names[0]); n != after {
		t.Errorf("the second run changed the indexes: %d bytes, were %d", n, after)
	}
}

// Packing makes no one wait for long: while it waits to begin capturing
// the month's writes (a trigger, which waits for the month's writers)
// for a transaction that holds a log of the month, another session
// updates, reads and inserts logs of the month, and the pack completes
// once that transaction ends, with every write in the rewritten month.
func TestPackingLetsTheMonthBeWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	names := retentiontest.Replace(t, pool, jan, feb)
	tenant := newTenants(t, pool, 1)[0]
	ids, _ := seedMany(t, pool, tenant, jan, 27*24*time.Hour, 2000, "billed")
	ps, err := usagelog.Partitions(ctx, pool)
	if err != nil || ps[0].Name != names[0] {
		t.Fatalf("partitions: %v %v", ps, err)
	}

	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `UPDATE usage_logs SET billing_message = 'held' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			done <- err
			return
		}
		defer conn.Release()
		_, err = usagelog.PackPartition(ctx, conn.Conn(), ps[0])
		done <- err
	}()
	polltest.Until(t, "the pack waits for the holder", 30*time.Second, func() bool {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'CREATE TRIGGER%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = pgx.BeginFunc(wctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(wctx, `UPDATE usage_logs SET billing_status = 'not_billable' WHERE id = ANY($1)`, ids[1:100]); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(wctx, `SELECT count(*) FROM usage_logs WHERE id = ANY($1)`, ids).Scan(&n); err != nil || n != len(ids) {
			return fmt.Errorf("read %d logs of %d: %v", n, len(ids), err)
		}
		_, err := tx.Exec(wctx, `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
				period_start, billing_status) VALUES ($1, $2, $3, 'u', 'm', 1, 1, $4, 'billed')`,
			retentiontest.ID(jan.Add(time.Hour)), tenant, jan.Add(time.Hour), jan)
		return err
	})
	if err != nil {
		t.Fatalf("writing the month while it is packed: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("the pack ended before the holder did: %v", err)
	default:
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("pack: %v", err)
	}
	var n, changed int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE billing_status = 'not_billable' OR billing_message = 'held')
		FROM `+names[0]).Scan(&n, &changed); err != nil || n != len(ids)+1 || changed != 100 {
		t.Errorf("after the pack: %d logs (want %d), %d changed (want 100): %v", n, len(ids)+1, changed, err)
	}
	for name, ix := range pgtest.Indexes(t, pool, names[0]) {
		if name != names[0]+"_ts_idx" && !(ix.Options == "fillfactor=100" && ix.Valid) {
			t.Errorf("index %s after packing: %+v", name, ix)
		}
	}
}

// `overage retention` prints each partition's packing in its INDEXES
// column: a run that packed one says so with its sizes, and calls the
// next one due "due, next run"; a dry run "would pack".
func TestWriteTextSaysWhereEachPackingStands(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	res := &retention.Result{Retention: "0", Partitions: []retention.Decision{
		{Partition: "p1", To: feb, Action: retention.ActionKept, Reason: "r", Indexes: retention.PackingPacked, PackedAt: &at},
		{Partition: "p2", To: mar, Action: retention.ActionKept, Reason: "r", Indexes: retention.PackingPacked, PackedAt: &at,
			IndexBytes: &[2]int64{412_300_000, 203_000_000}, HeapBytes: &[2]int64{1_200_000_000, 780_000_000}},
		{Partition: "p3", To: apr, Action: retention.ActionKept, Reason: "r", Indexes: retention.PackingDue},
		{Partition: "p4", To: apr, Action: retention.ActionKept, Reason: "r", Indexes: retention.PackingPending},
		{Partition: "p5", To: apr, Action: retention.ActionKept, Reason: "r", Indexes: retention.PackingOpen},
	}}
	var b strings.Builder
	if err := retention.WriteText(&b, res); err != nil {
		t.Fatal(err)
	}
	res.DryRun = true
	var dry strings.Builder
	if err := retention.WriteText(&dry, res); err != nil {
		t.Fatal(err)
	}
	for out, wants := range map[string][]string{
		b.String():   {"INDEXES", "packed 2026-12-02", "packed now, 412.3 MB to 203.0 MB (heap 1200.0 MB to 780.0 MB)", "due, next run", "pending logs", "open"},
		dry.String(): {"would pack"},
	} {
		for _, want := range wants {
			if !strings.Contains(out, want) {
				t.Errorf("lacks %q:\n%s", want, out)
			}
		}
	}
}
