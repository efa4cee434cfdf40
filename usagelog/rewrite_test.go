package usagelog

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// A pack rewrites the heap of a partition without losing a write made to
// it meanwhile: logs updated, inserted and deleted between the copy and
// the swap are as they were written in the rewritten partition, which
// holds the same indexes by the same names, attached to usage_logs' in
// the same range, and no dead versions. An interrupted pack leaves the
// partition as it was, and what a crashed one left (its copy, its table
// of changed ids and its trigger) is dropped by the next, whatever
// step it stopped at. The partition
// here is the first, whose range starts at MINVALUE.
func TestPackRewritesTheHeapKeepingWritesMadeDuringTheCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	if _, err := EnsurePartitions(ctx, pool); err != nil {
		t.Fatal(err)
	}
	parts, err := Partitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	p := parts[0]
	if p.LowerID != nil {
		t.Fatalf("the first partition has a lower bound: %+v", p)
	}
	at := p.Upper.Add(-60 * 24 * time.Hour)
	tenant := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id) VALUES ($1, 'rewrite', 'cus_rewrite')`, tenant); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	ids := make([]uuid.UUID, n)
	reqs := make([]string, n)
	for i := range ids {
		ids[i] = IDFloor(at.Add(time.Duration(i) * time.Second))
		ids[i][15] = byte(i)
		reqs[i] = fmt.Sprintf("r-%d", i)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id,
			input_tokens, output_tokens, period_start, billing_status, created_at)
		SELECT x.id, $2, x.r, $3, 'u', 'm', 10, 1, date_trunc('month', $3::timestamptz, 'UTC'), 'pending', $3
		FROM unnest($1::uuid[], $4::text[]) AS x(id, r)`, ids, tenant, at, reqs); err != nil {
		t.Fatal(err)
	}
	// Billed, not HOT (billing_status is in the partial indexes'
	// predicates): every log leaves a dead version.
	if _, err := pool.Exec(ctx, `UPDATE usage_logs SET billing_status = 'billed', billed_at = now() WHERE id = ANY($1)`, ids); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM `+ident(p.Name)); err != nil {
		t.Fatal(err)
	}
	// The partition's indexes, bar their options (the pack sets
	// fillfactor 100).
	indexesBefore := withoutOptions(pgtest.Indexes(t, pool, p.Name))
	boundBefore := bound(t, pool, p.Name)

	// A crash's leftovers, as the capture made them.
	r := rewrite{p: p}
	for _, q := range []string{
		`CREATE TABLE ` + ident(r.copyName()) + ` (LIKE ` + ident(p.Name) + `)`,
		`CREATE TABLE ` + ident(r.changesName()) + ` (id uuid NOT NULL)`,
		`CREATE TRIGGER ` + captureTrigger + ` AFTER INSERT OR UPDATE OR DELETE ON ` + ident(p.Name) +
			` FOR EACH ROW EXECUTE FUNCTION usage_log_pack_capture(` + quoteLiteral(r.changesName()) + `)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}

	// A pack interrupted between the copy and the swap changes nothing;
	// its leftovers (pgx closes a connection whose context is done, so
	// it cannot drop them) go in the next pack.
	before := pgtest.RowsDigest(t, pool, p.Name)
	cctx, cancel := context.WithCancel(ctx)
	afterCopy = cancel
	if _, err := packOn(t, cctx, pool, p); err == nil {
		t.Fatal("a pack cancelled before its swap succeeded")
	} else {
		t.Logf("the interrupted pack: %v", err)
	}
	afterCopy = nil
	if got := pgtest.RowsDigest(t, pool, p.Name); got != before {
		t.Errorf("an interrupted pack changed the partition: %s, was %s", got, before)
	}

	// Writes between the copy and the swap: updates, an insert, a delete.
	late := IDFloor(at.Add(-time.Hour))
	var want string
	afterCopy = func() {
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{`UPDATE usage_logs SET billing_message = 'resolved late' WHERE id = ANY($1)`, []any{ids[10:20]}},
			{`INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens, period_start,
				billing_status) VALUES ($1, $2, 'late', $3, 'u', 'm', 1, 1, date_trunc('month', $3::timestamptz, 'UTC'), 'billed')`,
				[]any{late, tenant, at}},
			{`DELETE FROM usage_logs WHERE id = $1`, []any{ids[5]}},
		} {
			if _, err := pool.Exec(ctx, q.sql, q.args...); err != nil {
				t.Errorf("write during the pack: %v", err)
			}
		}
		want = pgtest.RowsDigest(t, pool, p.Name)
	}
	defer func() { afterCopy = nil }()
	heapBefore := pgtest.TableBytes(t, pool, p.Name)
	done, err := packOn(t, ctx, pool, p)
	if err != nil {
		t.Fatalf("pack: %v", err)
	}
	if got := pgtest.RowsDigest(t, pool, p.Name); got != want || want == before {
		t.Errorf("after the pack: %s; written during it: %s (before it: %s)", got, want, before)
	}
	heapAfter := pgtest.TableBytes(t, pool, p.Name)
	if done.HeapBytesBefore != heapBefore || done.HeapBytesAfter != heapAfter || heapAfter*10 > heapBefore*6 {
		t.Errorf("heap %d bytes before, %d after; the pack says %d, %d", heapBefore, heapAfter, done.HeapBytesBefore, done.HeapBytesAfter)
	}
	t.Logf("heap %d bytes before, %d after", heapBefore, heapAfter)
	if got := withoutOptions(pgtest.Indexes(t, pool, p.Name)); !maps.Equal(got, indexesBefore) {
		t.Errorf("indexes after the pack:\n%v\nbefore:\n%v", got, indexesBefore)
	}
	if got := bound(t, pool, p.Name); got != boundBefore {
		t.Errorf("range after the pack: %s, was %s", got, boundBefore)
	}
	noLeftovers(t, pool, r)
	var columns int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stats WHERE schemaname = current_schema() AND tablename = $1`, p.Name).Scan(&columns); err != nil || columns == 0 {
		t.Errorf("the rewritten partition has no statistics (%d columns, %v)", columns, err)
	}
	var found int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE id = ANY($1)`, append(ids[:20:20], late)).Scan(&found); err != nil || found != 20 {
		t.Errorf("logs found through usage_logs: %d of 20 (%v)", found, err)
	}
}

// packOn packs p on a connection of pool.
func packOn(t *testing.T, ctx context.Context, pool *pgxpool.Pool, p Partition) (Pack, error) {
	t.Helper()
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	return PackPartition(ctx, conn.Conn(), p)
}

func withoutOptions(ixs map[string]pgtest.Index) map[string]pgtest.Index {
	for name, ix := range ixs {
		ix.Options = ""
		ixs[name] = ix
	}
	return ixs
}

func bound(t *testing.T, pool *pgxpool.Pool, table string) string {
	t.Helper()
	var b string
	if err := pool.QueryRow(context.Background(), `SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class c
		JOIN pg_inherits h ON h.inhrelid = c.oid WHERE c.oid = $1::regclass AND h.inhparent = 'usage_logs'::regclass`, table).Scan(&b); err != nil {
		t.Fatalf("the range of %s: %v", table, err)
	}
	return b
}

// noLeftovers fails the test if r's copy, table of changes or trigger is
// there.
func noLeftovers(t *testing.T, pool *pgxpool.Pool, r rewrite) {
	t.Helper()
	var left bool
	if err := pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL OR to_regclass($2) IS NOT NULL
		OR EXISTS (SELECT FROM pg_trigger WHERE tgrelid = $3::regclass AND NOT tgisinternal)`,
		r.copyName(), r.changesName(), r.p.Name).Scan(&left); err != nil || left {
		t.Errorf("a pack's leftovers are there (%v)", err)
	}
}
