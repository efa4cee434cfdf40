package usagelog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Packing a month's partition once it is written no more (retention runs
// it, usage_log_packs records it, migrations 0070 and 0071).
//
// While a month is written its indexes fill badly: concurrent batches
// insert ascending runs of UUIDv7 ids below each other's, so the primary
// key's leaves split in the middle and stay about two-thirds full; the
// request_id digests arrive in random order (about 70%); and billing's
// two updates of every log are almost never HOT (the second changes
// billing_status, which is in the partial indexes' predicates; a full
// page has no room for the first's new version), so each adds an entry
// to every index, and leaves a dead version in the heap. VACUUM frees
// those into space that only that month's later logs could reuse: a
// month billed as it is written keeps a fifth of its heap empty, a
// backlog billed at once three fifths (docs/benchmarks.md, "A billed
// month's heap rewritten").
// Once no log is minted in the month's range and none of its logs is
// pending, nothing but the rare late change (a review's resolution)
// writes to it again, so it is rewritten once: its logs copied, in id
// order, into a new table whose indexes are built full, which then takes
// its place (the type rewrite says how, and what it locks); its reports'
// indexes rebuilt at fillfactor 100 by REINDEX CONCURRENTLY, under a
// SHARE UPDATE EXCLUSIVE lock of that partition (reads, updates and
// inserts go on).

// PackAfter is how long after a partition's upper bound it may be
// packed: ids are minted at ingest, so no log enters its range after the
// bound, and a day covers the transactions in flight at the bound and
// the billing of its last logs.
const PackAfter = 24 * time.Hour

// PackFillfactor is the fillfactor of a packed partition's B-tree
// indexes: full leaves, as nothing is inserted in their key order again.
const PackFillfactor = 100

// Pack is a partition's packing, done or just done.
type Pack struct {
	Partition        string
	ReportsPartition string
	PackedAt         time.Time
	IndexBytesBefore int64 // pg_indexes_size of both tables before
	IndexBytesAfter  int64 // and after
	HeapBytesBefore  int64 // pg_table_size of the logs' partition before
	HeapBytesAfter   int64 // and after
}

// Packs lists the packed partitions by name. A partition whose pack
// rebuilt only its indexes (before migration 0071 packs rewrote the
// heap) is not among them: it is packed again, heap and all.
func Packs(ctx context.Context, db DB) (map[string]Pack, error) {
	rows, err := db.Query(ctx, `SELECT partition, coalesce(reports_partition, ''), packed_at, index_bytes_before, index_bytes_after,
			heap_bytes_before, heap_bytes_after
		FROM usage_log_packs WHERE heap_bytes_after IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("list the packed usage log partitions: %w", err)
	}
	defer rows.Close()
	out := map[string]Pack{}
	for rows.Next() {
		var p Pack
		if err := rows.Scan(&p.Partition, &p.ReportsPartition, &p.PackedAt, &p.IndexBytesBefore, &p.IndexBytesAfter,
			&p.HeapBytesBefore, &p.HeapBytesAfter); err != nil {
			return nil, fmt.Errorf("list the packed usage log partitions: %w", err)
		}
		out[p.Partition] = p
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list the packed usage log partitions: %w", err)
	}
	return out, nil
}

// PendingIn is whether any log of the usage_logs partition logs is
// pending: its billing will still update it (and its indexes). The read
// is a probe of the partial index of pending logs, whatever the size of
// the partition.
func PendingIn(ctx context.Context, db DB, logs string) (bool, error) {
	var pending bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+pgx.Identifier{logs}.Sanitize()+` WHERE billing_status = 'pending')`).Scan(&pending); err != nil {
		return false, fmt.Errorf("read whether %s holds pending logs: %w", logs, err)
	}
	return pending, nil
}

// PackPartition packs p: it rewrites the heap of its usage_logs partition
// (the type rewrite), which builds every index of it anew at PackFillfactor,
// rebuilds every index of its usage_reports partition at PackFillfactor
// (REINDEX CONCURRENTLY), and records it in usage_log_packs. It cannot
// run in a transaction (REINDEX CONCURRENTLY): db is one connection,
// whose session settings it changes for its statements and restores; the
// caller decides that p is due (PackAfter, no pending log) and keeps two
// packs of one partition apart (retention's lock). What an interrupted
// pack left behind is dropped first: an index a REINDEX CONCURRENTLY
// left invalid (named *_ccnew or *_ccold; no query uses it, but every
// write pays for it), and a rewrite's copy, its table of changed ids and
// its trigger.
//
// The statements run with statement_timeout 0: a month's rebuild takes
// minutes, and a deadline would only make it start again.
func PackPartition(ctx context.Context, db *pgx.Conn, p Partition) (Pack, error) {
	out := Pack{Partition: p.Name, ReportsPartition: p.Reports}
	tables := []string{p.Name}
	if p.Reports != "" {
		tables = append(tables, p.Reports)
	}
	indexSize := func() (int64, error) {
		var n int64
		for _, t := range tables {
			var b int64
			if err := db.QueryRow(ctx, `SELECT pg_indexes_size($1::regclass)`, t).Scan(&b); err != nil {
				return 0, fmt.Errorf("pack %s: size of %s's indexes: %w", p.Name, t, err)
			}
			n += b
		}
		return n, nil
	}
	heapSize := func() (int64, error) {
		var b int64
		if err := db.QueryRow(ctx, `SELECT pg_table_size($1::regclass)`, p.Name).Scan(&b); err != nil {
			return 0, fmt.Errorf("pack %s: size of its heap: %w", p.Name, err)
		}
		return b, nil
	}
	r := rewrite{db: db, p: p}
	if err := r.dropLeftovers(ctx); err != nil {
		return out, fmt.Errorf("pack %s: %w", p.Name, err)
	}
	for _, t := range tables {
		if err := dropLeftovers(ctx, db, t); err != nil {
			return out, fmt.Errorf("pack %s: %w", p.Name, err)
		}
	}
	var err error
	if out.IndexBytesBefore, err = indexSize(); err != nil {
		return out, err
	}
	if out.HeapBytesBefore, err = heapSize(); err != nil {
		return out, err
	}
	if _, err := db.Exec(ctx, `SET statement_timeout = 0`); err != nil {
		return out, fmt.Errorf("pack %s: %w", p.Name, err)
	}
	defer func() { _, _ = db.Exec(context.WithoutCancel(ctx), `RESET statement_timeout`) }()
	// The logs' indexes at PackFillfactor first: the copy's are built
	// from their definitions.
	if err := setFillfactor(ctx, db, p.Name); err != nil {
		return out, fmt.Errorf("pack %s: %w", p.Name, err)
	}
	if err := r.run(ctx); err != nil {
		if cerr := r.dropLeftovers(context.WithoutCancel(ctx)); cerr != nil {
			err = errors.Join(err, fmt.Errorf("and its leftovers stay for the next pack: %w", cerr))
		}
		return out, fmt.Errorf("pack %s: %w", p.Name, err)
	}
	if p.Reports != "" {
		if err := setFillfactor(ctx, db, p.Reports); err != nil {
			return out, fmt.Errorf("pack %s: %w", p.Name, err)
		}
		if _, err := db.Exec(ctx, `REINDEX TABLE CONCURRENTLY `+pgx.Identifier{p.Reports}.Sanitize()); err != nil {
			return out, fmt.Errorf("pack %s: reindex %s: %w", p.Name, p.Reports, err)
		}
	}
	if out.IndexBytesAfter, err = indexSize(); err != nil {
		return out, err
	}
	if out.HeapBytesAfter, err = heapSize(); err != nil {
		return out, err
	}
	if err := db.QueryRow(ctx, `INSERT INTO usage_log_packs (partition, reports_partition, index_bytes_before, index_bytes_after,
			heap_bytes_before, heap_bytes_after)
		VALUES ($1, nullif($2, ''), $3, $4, $5, $6)
		ON CONFLICT (partition) DO UPDATE SET reports_partition = EXCLUDED.reports_partition, packed_at = now(),
			index_bytes_before = EXCLUDED.index_bytes_before, index_bytes_after = EXCLUDED.index_bytes_after,
			heap_bytes_before = EXCLUDED.heap_bytes_before, heap_bytes_after = EXCLUDED.heap_bytes_after
		RETURNING packed_at`, p.Name, p.Reports, out.IndexBytesBefore, out.IndexBytesAfter,
		out.HeapBytesBefore, out.HeapBytesAfter).Scan(&out.PackedAt); err != nil {
		return out, fmt.Errorf("pack %s: record it: %w", p.Name, err)
	}
	return out, nil
}

// dropLeftovers drops the indexes of table an interrupted REINDEX
// CONCURRENTLY left invalid.
func dropLeftovers(ctx context.Context, db DB, table string) error {
	names, err := indexNames(ctx, db, `SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = $1::regclass AND NOT i.indisvalid AND c.relname ~ '_cc(new|old)[0-9]*$'`, table)
	if err != nil {
		return fmt.Errorf("list the leftover indexes of %s: %w", table, err)
	}
	for _, n := range names {
		if _, err := db.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+pgx.Identifier{n}.Sanitize()); err != nil {
			return fmt.Errorf("drop the leftover index %s: %w", n, err)
		}
	}
	return nil
}

// setFillfactor sets PackFillfactor on table's B-tree indexes that have
// another (a SHARE UPDATE EXCLUSIVE lock each, catalogue only: the
// REINDEX that follows builds them so).
func setFillfactor(ctx context.Context, db DB, table string) error {
	names, err := indexNames(ctx, db, `SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
		WHERE i.indrelid = $1::regclass AND a.amname = 'btree'
			AND NOT coalesce(c.reloptions @> ARRAY['fillfactor=' || $2::int], false)`, table, PackFillfactor)
	if err != nil {
		return fmt.Errorf("list the indexes of %s: %w", table, err)
	}
	for _, n := range names {
		if _, err := db.Exec(ctx, fmt.Sprintf(`ALTER INDEX %s SET (fillfactor = %d)`, pgx.Identifier{n}.Sanitize(), PackFillfactor)); err != nil {
			return fmt.Errorf("set the fillfactor of %s: %w", n, err)
		}
	}
	return nil
}

// indexNames runs q, a query of index names.
func indexNames(ctx context.Context, db DB, q string, args ...any) ([]string, error) {
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
