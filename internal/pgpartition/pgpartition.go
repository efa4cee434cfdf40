// Package pgpartition reads and detaches the range partitions by time of
// a partitioned table, for the packages that keep one (idempotency,
// webhooks/partitions): what is generic about a partition's lifecycle, apart from what
// each table's owner decides (its bounds, its indexes, when it may go).
package pgpartition

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
)

// Partition is one partition of a table partitioned by a timestamptz.
type Partition struct {
	Name string
	// Its rows' keys are at or after Lower (nil: MINVALUE, a first
	// partition that spans everything before Upper) and before Upper.
	Lower *time.Time
	Upper time.Time
	// Pending: a DETACH CONCURRENTLY was interrupted; Detach finishes it.
	Pending bool
}

// boundsSQL lists a table's partitions with their bounds (NULL for
// MINVALUE), oldest first.
const boundsSQL = `SELECT c.relname,
		(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)'))[1]::timestamptz,
		(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz,
		i.inhdetachpending
	FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
	WHERE i.inhparent = $1::regclass
	ORDER BY 3`

// List returns the partitions of parent, oldest first, bounds in UTC.
func List(ctx context.Context, db overage.DB, parent string) ([]Partition, error) {
	rows, err := db.Query(ctx, boundsSQL, parent)
	if err != nil {
		return nil, fmt.Errorf("list the partitions of %s: %w", parent, err)
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Partition, error) {
		var p Partition
		err := r.Scan(&p.Name, &p.Lower, &p.Upper, &p.Pending)
		if p.Lower != nil {
			l := p.Lower.UTC()
			p.Lower = &l
		}
		p.Upper = p.Upper.UTC()
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("list the partitions of %s: %w", parent, err)
	}
	return ps, nil
}

// Detach detaches p from parent CONCURRENTLY, or FINALIZEs it when an
// earlier detach was cut short. It waits for every transaction that may
// still read the partition and takes no lock that stops the table's
// writers; it cannot run in a transaction block, so db is a pool or a
// connection.
func Detach(ctx context.Context, db overage.DB, parent string, p Partition) error {
	q := fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %s CONCURRENTLY`, parent, p.Name)
	if p.Pending {
		q = fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %s FINALIZE`, parent, p.Name)
	}
	if _, err := db.Exec(ctx, q); err != nil {
		return fmt.Errorf("detach partition %s of %s: %w", p.Name, parent, err)
	}
	return nil
}

// Detached lists the plain tables of the current schema whose names match
// pattern (a POSIX regular expression) and that are no partition of
// anything: partitions detached and left undropped by a crash in between.
func Detached(ctx context.Context, db overage.DB, pattern string) ([]string, error) {
	rows, err := db.Query(ctx, `SELECT c.relname FROM pg_class c
		WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace
		  AND c.relname ~ $1
		  AND NOT EXISTS (SELECT FROM pg_inherits i WHERE i.inhrelid = c.oid)
		ORDER BY 1`, pattern)
	if err != nil {
		return nil, fmt.Errorf("list detached partitions: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list detached partitions: %w", err)
	}
	return names, nil
}

// Lock takes, in tx, the advisory lock key that serialises the changes of
// one table's partitions (what names them in an error), then bounds the
// transaction's waits for table locks: behind a long transaction, a
// change queues for a while and then gives up (its next run tries again)
// rather than hold up the writes queued behind it.
func Lock(ctx context.Context, tx pgx.Tx, key int64, what string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, key); err != nil {
		return fmt.Errorf("lock %s partitions: %w", what, err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
		return fmt.Errorf("set lock_timeout: %w", err)
	}
	return nil
}

// Table is a partition Name of the partitioned table Parent.
type Table struct {
	Parent, Name string
}

// EndEmptyFirst ends the first partitions firsts (each FROM (MINVALUE)) at
// bound, a partition key literal, when none of them holds a row, and says
// whether it did. They are locked ACCESS EXCLUSIVE before they are looked
// at (tx holds Lock, so the wait is bounded): a write routed to them waits,
// and after the commit goes where the new bounds send it. Partitions that
// hold a row are left as they are. Given in order of dependence (a table
// whose rows others reference first), they are detached in reverse and
// attached again in order.
func EndEmptyFirst(ctx context.Context, tx pgx.Tx, firsts []Table, bound string) (bool, error) {
	names := make([]string, len(firsts))
	holds := make([]string, len(firsts))
	for i, f := range firsts {
		names[i] = f.Name
		holds[i] = fmt.Sprintf(`EXISTS (SELECT FROM %s)`, f.Name)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`LOCK TABLE %s IN ACCESS EXCLUSIVE MODE`, strings.Join(names, ", "))); err != nil {
		return false, fmt.Errorf("lock the first partitions %v: %w", names, err)
	}
	var held bool
	if err := tx.QueryRow(ctx, `SELECT `+strings.Join(holds, " OR ")).Scan(&held); err != nil {
		return false, fmt.Errorf("read whether the first partitions %v hold rows: %w", names, err)
	}
	if held {
		return false, nil
	}
	var qs []string
	for i := len(firsts) - 1; i >= 0; i-- {
		qs = append(qs, fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %s`, firsts[i].Parent, firsts[i].Name))
	}
	for _, f := range firsts {
		qs = append(qs, fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (MINVALUE) TO ('%s')`, f.Parent, f.Name, bound))
	}
	for _, q := range qs {
		if _, err := tx.Exec(ctx, q); err != nil {
			return false, fmt.Errorf("end the first partitions %v at %s: %w", names, bound, err)
		}
	}
	return true, nil
}
