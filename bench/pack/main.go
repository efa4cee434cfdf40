// Command pack packs the usage log partitions of a benchmark database
// that hold logs (usagelog.PackPartition, what retention does to a month
// once it is over and billed: its heap rewritten, its indexes rebuilt)
// whatever their month, and prints each one's bytes a log, heap and every
// index, before and after, as text.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage/usagelog"
)

func main() {
	dbURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "the benchmark database")
	flag.Parse()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, *dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	ps, err := usagelog.Partitions(ctx, conn)
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range ps {
		var logs int64
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{p.Name}.Sanitize()).Scan(&logs); err != nil {
			log.Fatal(err)
		}
		if logs == 0 {
			continue
		}
		report(ctx, conn, p.Name, logs, "before packing")
		start := time.Now()
		done, err := usagelog.PackPartition(ctx, conn, p)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("packed %s in %.1f s: indexes of logs and reports %d -> %d bytes (%.1f -> %.1f a log), heap %d -> %d bytes (%.1f -> %.1f a log)\n", p.Name,
			time.Since(start).Seconds(), done.IndexBytesBefore, done.IndexBytesAfter,
			float64(done.IndexBytesBefore)/float64(logs), float64(done.IndexBytesAfter)/float64(logs),
			done.HeapBytesBefore, done.HeapBytesAfter, float64(done.HeapBytesBefore)/float64(logs), float64(done.HeapBytesAfter)/float64(logs))
		report(ctx, conn, p.Name, logs, "after packing")
	}
}

// report prints the partition's bytes a log: in all, its heap (with its
// free space and visibility maps) and each index over one page.
func report(ctx context.Context, conn *pgx.Conn, name string, logs int64, when string) {
	var total, heap int64
	if err := conn.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass), pg_table_size($1::regclass)`, name).Scan(&total, &heap); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s, %s, %d logs: %.1f bytes a log (heap %.1f)\n", name, when, logs, float64(total)/float64(logs), float64(heap)/float64(logs))
	rows, err := conn.Query(ctx, `SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = $1::regclass AND pg_relation_size(c.oid) > 8192 ORDER BY 1`, name)
	if err != nil {
		log.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var idx string
		var b int64
		if err := rows.Scan(&idx, &b); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("  index %s %.1f\n", idx, float64(b)/float64(logs))
	}
	if err := rows.Err(); err != nil {
		log.Fatal(err)
	}
}
