// Package idempotency owns the lifecycle of the stored answers of
// Idempotency-Keys (table idempotency_keys): a table partitioned by expiry
// day (layout.go), whose partitions are created a week ahead and dropped
// whole once every record in them has expired. No record is ever deleted row by row
// for its age.
//
// The ingest transaction reads and writes the records (package ingest);
// this package only creates and drops partitions, and says what is there.
package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/pgpartition"
)

// DB is a pool or a connection: partitions are kept from both.
type DB interface {
	overage.DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Partition is one partition of idempotency_keys: its records expire at
// or after Lower (nil: the first partition, which spans everything before
// Upper) and before Upper; Pending, a DETACH CONCURRENTLY was interrupted
// and Maintain finishes it.
type Partition = pgpartition.Partition

// lockID serialises partition changes of concurrent workers and migrators
// ("ovg-idem" read as a big-endian integer).
const lockID int64 = 0x6f76672d6964656d

// maintainLockID makes Maintain and DropExpired runs one at a time
// ("ovg-idmt" read as a big-endian integer): two of them racing would
// DETACH the same partition, and the second fails (the partition is
// pending detach, or gone). It is a session lock, not a transaction's:
// DETACH … CONCURRENTLY cannot run in a transaction block, so the run
// holds it on one connection from first statement to last. It is apart
// from lockID so that a migrator's EnsurePartitions waits only for the
// creations, as before, not for a detach waiting on long transactions.
const maintainLockID int64 = 0x6f76672d69646d74

// Partitions lists the partitions, oldest first.
func Partitions(ctx context.Context, db DB) ([]Partition, error) {
	return partitions(ctx, db)
}

func partitions(ctx context.Context, db overage.DB) ([]Partition, error) {
	return pgpartition.List(ctx, db, "idempotency_keys")
}

// covers reports whether p holds records expiring at t.
func covers(p Partition, t time.Time) bool {
	return (p.Lower == nil || !t.Before(*p.Lower)) && t.Before(p.Upper)
}

// KeyDigest is the expression of the partitions' unique index (since
// 0032), of the tenant and key expressions given: the MD5 of the tenant id
// and the key as a uuid, the index's one column. An entry is 28 bytes
// with its line pointer whatever the key's length (44 with the tenant id
// beside the key's digest, as 0052 made it; 100-127 on the key itself), so
// the index has a third fewer pages for the same keys: fewer pages to
// cache, and fewer to write whole after each checkpoint, since a digest
// spreads the inserts over every leaf (docs/benchmarks.md, "The drop
// diagnosed"). The digest only finds and referees records: a lookup also
// compares the tenant and the key themselves, so two pairs with one digest
// never answer for each other; at worst the second is refused as a
// duplicate, and finding another tenant's pair would take a second
// preimage of MD5 under that tenant's id and a key one does not know.
// Partitions made before keep their index until they are dropped: the
// lookups state every index's condition (keyConditions).
func KeyDigest(tenant, key string) string {
	return "md5(" + tenant + "::text || " + key + ")::uuid"
}

// keyDigest0052 is the expression of the unique index of the partitions
// made from 0052 to 0032, on (tenant_id, this).
func keyDigest0052(key string) string { return "md5(" + key + ")::uuid" }

// EnsurePartitions creates the missing day partitions from today (UTC, by
// the database's clock) to Ahead days beyond it, and returns the names of
// those it created. A day already covered (by the first partition, which
// spans days) is skipped. Each is made empty and apart, with its unique
// index, then attached: ATTACH takes only a SHARE UPDATE EXCLUSIVE lock
// on idempotency_keys, so ingest reads and writes on meanwhile.
func EnsurePartitions(ctx context.Context, db DB) ([]string, error) {
	return ensurePartitions(ctx, db, lay)
}

// ensurePartitions is EnsurePartitions of l's partitions: l.Width wide
// (a day in production), the current one and l.Ahead beyond it.
func ensurePartitions(ctx context.Context, db DB, l layout) ([]string, error) {
	var created []string
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lockPartitions(ctx, tx); err != nil {
			return err
		}
		var err error
		created, err = ensureBins(ctx, tx, l)
		return err
	})
	if err != nil {
		return nil, err
	}
	return created, nil
}

func lockPartitions(ctx context.Context, tx pgx.Tx) error {
	return pgpartition.Lock(ctx, tx, lockID, "idempotency record")
}

// currentBin is the start of the current partition by the database's
// clock: bins of l.Width from a UTC midnight, so for a day wide the UTC
// day, date_trunc('day', now(), 'UTC').
func currentBin(ctx context.Context, tx pgx.Tx, l layout) (time.Time, error) {
	var current time.Time
	if err := tx.QueryRow(ctx, `SELECT date_bin(make_interval(secs => $1), now(), timestamptz '2000-01-01 00:00:00+00')`,
		l.Width.Seconds()).Scan(&current); err != nil {
		return current, fmt.Errorf("read the database clock: %w", err)
	}
	return current.UTC(), nil
}

// ensureBins is ensurePartitions in tx, which holds lockPartitions.
func ensureBins(ctx context.Context, tx pgx.Tx, l layout) ([]string, error) {
	current, err := currentBin(ctx, tx, l)
	if err != nil {
		return nil, err
	}
	ps, err := partitions(ctx, tx)
	if err != nil {
		return nil, err
	}
	var created []string
bins:
	for d := current; !d.After(current.Add(time.Duration(l.Ahead) * l.Width)); d = d.Add(l.Width) {
		for _, p := range ps {
			if covers(p, d) {
				continue bins
			}
		}
		name := l.name(d)
		upper := d.Add(l.Width)
		for _, q := range []string{
			fmt.Sprintf(`CREATE TABLE %s (LIKE idempotency_keys INCLUDING DEFAULTS INCLUDING COMPRESSION)`, name),
			fmt.Sprintf(`CREATE UNIQUE INDEX %s_key ON %s ((%s))`, name, name, KeyDigest("tenant_id", "idempotency_key")),
			fmt.Sprintf(`ALTER TABLE idempotency_keys ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`,
				name, d.Format(time.RFC3339), upper.Format(time.RFC3339)),
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return nil, fmt.Errorf("create idempotency record partition %s: %w", name, err)
			}
		}
		created = append(created, name)
	}
	return created, nil
}

// FitFirstPartition ends the first partition (idempotency_keys_legacy) at
// the start of the current one when it holds no record, then creates the
// partitions from there as EnsurePartitions does, in one transaction; it
// reports whether it refitted it. It is for a new database (`overage
// migrate` runs it): migration 0025 made the table as it was the partition
// of every expiry up to three UTC days ahead of the migration, so a new
// deployment's first days of records would share that one partition and
// its one unique index, which grows by every record of those days, where
// each later day has a partition of its own. A first partition holding a
// record is left as it is. It is locked (ACCESS EXCLUSIVE, under
// lock_timeout) before it is looked at: an ingest routing a record to it
// waits, and once this commits the record goes to the day's partition,
// made in the same transaction.
func FitFirstPartition(ctx context.Context, db DB) (bool, []string, error) {
	return fitFirstPartition(ctx, db, lay)
}

func fitFirstPartition(ctx context.Context, db DB, l layout) (bool, []string, error) {
	var (
		fitted  bool
		created []string
	)
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lockPartitions(ctx, tx); err != nil {
			return err
		}
		current, err := currentBin(ctx, tx, l)
		if err != nil {
			return err
		}
		ps, err := partitions(ctx, tx)
		if err != nil {
			return err
		}
		if len(ps) > 0 && ps[0].Lower == nil && ps[0].Upper.After(current) {
			fitted, err = pgpartition.EndEmptyFirst(ctx, tx, []pgpartition.Table{{Parent: "idempotency_keys", Name: ps[0].Name}},
				current.Format(time.RFC3339))
			if err != nil {
				return err
			}
		}
		created, err = ensureBins(ctx, tx, l)
		return err
	})
	if err != nil {
		return false, nil, err
	}
	return fitted, created, nil
}

// DropExpired detaches and drops every partition whose records all expired
// DropMargin ago or more, and returns their names. DETACH CONCURRENTLY
// waits for every transaction that may still read the partition and takes
// no lock that stops ingest; one left pending by a crash is finished first.
//
// Another run in progress (Maintain's or DropExpired's, in any process)
// makes this one do nothing: it returns no names and no error.
func DropExpired(ctx context.Context, db DB) ([]string, error) {
	var dropped []string
	_, err := withMaintainLock(ctx, db, func(db DB) error {
		var err error
		dropped, err = dropExpired(ctx, db, lay)
		return err
	})
	return dropped, err
}

// withMaintainLock runs fn on one session holding maintainLockID, and
// reports whether it ran: false, with no error, when another session holds
// it (pg_try_advisory_lock, so a run never queues behind one that may be
// waiting on a long transaction). A pool lends a connection for the run;
// any other db is taken to be one session already (a connection: DETACH
// CONCURRENTLY fails in a transaction).
func withMaintainLock(ctx context.Context, db DB, fn func(DB) error) (bool, error) {
	if pool, ok := db.(*pgxpool.Pool); ok {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return false, fmt.Errorf("acquire a connection for idempotency record partitions: %w", err)
		}
		defer conn.Release()
		db = conn
	}
	var got bool
	if err := db.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, maintainLockID).Scan(&got); err != nil {
		return false, fmt.Errorf("lock idempotency record maintenance: %w", err)
	}
	if !got {
		return false, nil
	}
	defer func() {
		// Not cut by ctx: a lock left on a connection back in the pool
		// would stop every later run of this process and the others'.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := db.Exec(uctx, `SELECT pg_advisory_unlock($1)`, maintainLockID); err != nil {
			if conn, ok := db.(*pgxpool.Conn); ok {
				// Closed, the pool drops it, and the lock ends with its session.
				_ = conn.Conn().Close(uctx)
			}
		}
	}()
	return true, fn(db)
}

// dropExpired is DropExpired with l's margin.
func dropExpired(ctx context.Context, db DB, l layout) ([]string, error) {
	ps, err := Partitions(ctx, db)
	if err != nil {
		return nil, err
	}
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, fmt.Errorf("read the database clock: %w", err)
	}
	var dropped []string
	for _, p := range ps {
		if p.Upper.After(now.Add(-l.DropMargin)) {
			continue
		}
		if err := pgpartition.Detach(ctx, db, "idempotency_keys", p); err != nil {
			return dropped, fmt.Errorf("expired idempotency records: %w", err)
		}
		if _, err := db.Exec(ctx, fmt.Sprintf(`DROP TABLE %s`, p.Name)); err != nil {
			return dropped, fmt.Errorf("drop expired idempotency record partition %s: %w", p.Name, err)
		}
		dropped = append(dropped, p.Name)
	}
	// A partition detached but not dropped (a crash in between): nothing
	// reads it any more.
	leftovers, err := pgpartition.Detached(ctx, db, leftoverPattern)
	if err != nil {
		return dropped, fmt.Errorf("idempotency record partitions: %w", err)
	}
	for _, name := range leftovers {
		if _, err := db.Exec(ctx, fmt.Sprintf(`DROP TABLE %s`, name)); err != nil {
			return dropped, fmt.Errorf("drop detached idempotency record partition %s: %w", name, err)
		}
		dropped = append(dropped, name)
	}
	return dropped, nil
}

// Maintain creates the missing partitions and drops the expired ones: what
// `overage work` runs every MaintainEvery. The partitions ahead are made
// first and whatever the drops do: ingest fails without them, while a drop
// that fails (a DETACH … CONCURRENTLY cut short under load) only leaves a
// partition for the next run.
//
// Runs are one at a time (maintainLockID, held on one connection of db
// for the whole run): one that finds another in progress, in this process
// or another `work`, logs it and returns nil, since that one makes the
// partitions ahead and drops the expired ones.
func Maintain(ctx context.Context, db DB, logger *slog.Logger) error {
	return maintain(ctx, db, logger, lay)
}

func maintain(ctx context.Context, db DB, logger *slog.Logger, l layout) error {
	ran, err := withMaintainLock(ctx, db, func(db DB) error { return maintainLocked(ctx, db, logger, l) })
	if err == nil && !ran {
		logger.InfoContext(ctx, "idempotency record partitions: another maintenance run is in progress; skipped")
	}
	return err
}

// maintainLocked is Maintain on db, one session holding maintainLockID.
func maintainLocked(ctx context.Context, db DB, logger *slog.Logger, l layout) error {
	created, createErr := ensurePartitions(ctx, db, l)
	for _, name := range created {
		logger.InfoContext(ctx, "idempotency record partition created", "partition", name)
	}
	dropped, dropErr := dropExpired(ctx, db, l)
	for _, name := range dropped {
		logger.InfoContext(ctx, "expired idempotency records dropped", "partition", name)
	}
	return errors.Join(createErr, dropErr)
}
