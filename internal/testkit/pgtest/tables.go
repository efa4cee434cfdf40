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
