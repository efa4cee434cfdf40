package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TableBytes is pg_table_size of table: its heap, TOAST and maps, no
// index.
func TableBytes(t testing.TB, pool *pgxpool.Pool, table string) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT pg_table_size($1::regclass)`, table).Scan(&n); err != nil {
		t.Fatalf("the size of %s: %v", table, err)
	}
	return n
}

// RowsDigest is the number of rows of table and a digest of every row,
// whole, in id order: equal before and after a rewrite of the table only
// if no row was lost, added or changed.
func RowsDigest(t testing.TB, pool *pgxpool.Pool, table string) string {
	t.Helper()
	var d string
	if err := pool.QueryRow(context.Background(), `SELECT count(*) || ':' || coalesce(md5(string_agg(r::text, '|' ORDER BY id)), '') FROM `+
		pgx.Identifier{table}.Sanitize()+` r`).Scan(&d); err != nil {
		t.Fatalf("the rows of %s: %v", table, err)
	}
	return d
}

// Index is one index of a table, as the catalogue has it.
type Index struct {
	// Def is pg_get_indexdef without its WITH (…) options.
	Def string
	// Options are its reloptions joined by commas ("fillfactor=100").
	Options string
	Valid   bool
	// Parent is the partitioned index it is attached to, "" for none.
	Parent string
}

// Indexes is every index of table, by name.
func Indexes(t testing.TB, pool *pgxpool.Pool, table string) map[string]Index {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c.relname, regexp_replace(pg_get_indexdef(i.indexrelid), ' WITH \([^)]*\)', ''),
			coalesce(array_to_string(c.reloptions, ','), ''), i.indisvalid, coalesce(h.inhparent::regclass::text, '')
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid LEFT JOIN pg_inherits h ON h.inhrelid = i.indexrelid
		WHERE i.indrelid = $1::regclass`, table)
	if err != nil {
		t.Fatalf("the indexes of %s: %v", table, err)
	}
	defer rows.Close()
	out := map[string]Index{}
	for rows.Next() {
		var name string
		var ix Index
		if err := rows.Scan(&name, &ix.Def, &ix.Options, &ix.Valid, &ix.Parent); err != nil {
			t.Fatalf("the indexes of %s: %v", table, err)
		}
		out[name] = ix
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("the indexes of %s: %v", table, err)
	}
	return out
}
