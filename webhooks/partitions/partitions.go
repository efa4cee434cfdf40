// Package partitions owns the lifecycle of stripe_webhook_events'
// partitions (the table's statements are package webhooks'): one a UTC
// month of receipt, created months ahead by `overage migrate` and
// `overage work`, and dropped whole once the month is 365 days past and
// every event in it is processed. No event is ever deleted row by row.
//
// It imports nothing of the product but the root package and
// internal/pgpartition, so that the migrator and the test kit can keep the
// partitions without an import cycle (package webhooks imports tenants
// and, through it, usagelog, whose own tests use the test kit).
package partitions

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

// Ahead is how many UTC months of partitions beyond the current one are
// kept ready, so webhooks are stored for two months should no `overage
// work` run.
const Ahead = 2

// Partition is one partition of stripe_webhook_events: its events were
// received at or after Lower (nil: the first partition, which spans
// everything before Upper) and before Upper.
type Partition = pgpartition.Partition

// table is the partitioned table.
const table = "stripe_webhook_events"

// partitionLock serialises partition changes of concurrent workers and
// migrators ("ovg-hook" read as a big-endian integer).
const partitionLock int64 = 0x6f76672d686f6f6b

// Partitions lists the partitions, oldest first.
func Partitions(ctx context.Context, db overage.DB) ([]Partition, error) {
	return pgpartition.List(ctx, db, table)
}

// partitioned reports whether stripe_webhook_events is partitioned yet: a
// `work` of this version may run against a database 0046 has not reached,
// where the partitions are not its to keep.
func partitioned(ctx context.Context, db overage.DB) (bool, error) {
	var kind *string
	if err := db.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = to_regclass('stripe_webhook_events')`).Scan(&kind); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("read the kind of stripe_webhook_events: %w", err)
	}
	return kind != nil && *kind == "p", nil
}

// Ensure creates the month partitions (UTC, by the database's
// clock) from the end of the last one to Ahead months beyond the current
// month, and returns the names of those it created. Each is made empty and
// apart, with its unique index on (event_id, account), then attached:
// ATTACH takes only a SHARE UPDATE EXCLUSIVE lock on stripe_webhook_events,
// so deliveries are stored meanwhile.
func Ensure(ctx context.Context, db DB) ([]string, error) {
	var created []string
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var horizon time.Time
		if err := lockPartitions(ctx, tx); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT date_trunc('month', now(), 'UTC') + make_interval(months => $1)`, Ahead+1).Scan(&horizon); err != nil {
			return fmt.Errorf("read the database clock: %w", err)
		}
		for {
			name, err := addPartition(ctx, tx, horizon)
			if err != nil {
				return err
			}
			if name == "" {
				return nil
			}
			created = append(created, name)
		}
	})
	if err != nil {
		return nil, err
	}
	return created, nil
}

// Add creates the one partition that follows the last, up to the next UTC
// month's start or until, whichever comes first, and returns its name (""
// when the partitions already reach until; from MINVALUE when there is
// none). Ensure calls it month by month; a test calls it to put a bound
// where it wants one, a second ahead say.
func Add(ctx context.Context, db DB, until time.Time) (string, error) {
	var name string
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lockPartitions(ctx, tx); err != nil {
			return err
		}
		var err error
		name, err = addPartition(ctx, tx, until)
		return err
	})
	return name, err
}

func lockPartitions(ctx context.Context, tx pgx.Tx) error {
	return pgpartition.Lock(ctx, tx, partitionLock, "webhook event")
}

// addPartition is Add in tx, which holds the partitions' lock.
func addPartition(ctx context.Context, tx pgx.Tx, until time.Time) (string, error) {
	ps, err := Partitions(ctx, tx)
	if err != nil {
		return "", err
	}
	until = until.UTC()
	var lower *time.Time
	upper := until
	if len(ps) > 0 {
		last := ps[len(ps)-1].Upper
		if !last.Before(until) {
			return "", nil
		}
		lower = &last
		if next := time.Date(last.Year(), last.Month()+1, 1, 0, 0, 0, 0, time.UTC); next.Before(until) {
			upper = next
		}
	}
	name, from := partitionName(lower, upper), "MINVALUE"
	if lower != nil {
		from = "'" + lower.Format(time.RFC3339Nano) + "'"
	}
	for _, q := range []string{
		fmt.Sprintf(`CREATE TABLE %s (LIKE stripe_webhook_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`, name),
		// The referee of duplicates inside the month; across months the
		// store's event lock (webhooks.Handler.Store) is.
		fmt.Sprintf(`CREATE UNIQUE INDEX %s_event_account ON %s (event_id, account)`, name, name),
		fmt.Sprintf(`ALTER TABLE stripe_webhook_events ATTACH PARTITION %s FOR VALUES FROM (%s) TO ('%s')`,
			name, from, upper.Format(time.RFC3339Nano)),
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return "", fmt.Errorf("create webhook event partition %s: %w", name, err)
		}
	}
	return name, nil
}

// partitionName is stripe_webhook_events_YYYYMM for a month, else named
// after its lower bound to the second.
func partitionName(lower *time.Time, upper time.Time) string {
	switch {
	case lower == nil:
		return "stripe_webhook_events_before_" + upper.Format("20060102_150405")
	case lower.Equal(time.Date(lower.Year(), lower.Month(), 1, 0, 0, 0, 0, time.UTC)) && upper.Equal(lower.AddDate(0, 1, 0)):
		return "stripe_webhook_events_" + lower.Format("200601")
	default:
		return "stripe_webhook_events_" + lower.Format("20060102_150405")
	}
}

// Dropped is what DropExpired did: the partitions dropped and those past
// retention kept because an event in them is still unprocessed.
type Dropped struct {
	Dropped []string
	Kept    []Kept
}

// Kept is a partition past retention holding unprocessed events.
type Kept struct {
	Name        string
	Unprocessed int64
}

// DropExpired detaches and drops every partition whose whole range ended
// retention ago or more and whose every event is processed. One holding
// an unprocessed event is kept (it is still owed its effect) and reported.
// Nothing is deleted row by row.
//
// DETACH … CONCURRENTLY, not DROP under a lock timeout: a DROP of a
// partition takes ACCESS EXCLUSIVE on stripe_webhook_events, so it waits
// for every transaction on the table and stops every delivery queued
// behind it for as long; DETACH CONCURRENTLY waits for them without
// stopping anyone, and the DROP that follows touches only the detached
// table, which no statement reads any more. One left pending by a crash is
// finished (FINALIZE) first. It cannot run in a transaction, so the
// partitions are serialised by partitionLock held on the session: another
// maintainer holding it makes this run do nothing.
func DropExpired(ctx context.Context, pool *pgxpool.Pool, retention time.Duration) (Dropped, error) {
	var res Dropped
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("acquire a connection for webhook event partitions: %w", err)
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, partitionLock).Scan(&got); err != nil {
		return res, fmt.Errorf("lock webhook event partitions: %w", err)
	}
	if !got {
		return res, nil
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, partitionLock)
	}()

	ps, err := Partitions(ctx, conn)
	if err != nil {
		return res, err
	}
	var cutoff time.Time
	if err := conn.QueryRow(ctx, `SELECT now() - make_interval(secs => $1)`, retention.Seconds()).Scan(&cutoff); err != nil {
		return res, fmt.Errorf("read the database clock: %w", err)
	}
	for _, p := range ps {
		if p.Upper.After(cutoff) {
			continue
		}
		// No event can enter a partition whose range is past: every event
		// is stored at now() (received_at's default). So a partition
		// found fully processed here stays so until it is dropped.
		n, err := unprocessed(ctx, conn, p.Name)
		if err != nil {
			return res, err
		}
		if n > 0 {
			res.Kept = append(res.Kept, Kept{Name: p.Name, Unprocessed: n})
			continue
		}
		if err := pgpartition.Detach(ctx, conn, table, p); err != nil {
			return res, fmt.Errorf("expired webhook events: %w", err)
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf(`DROP TABLE %s`, p.Name)); err != nil {
			return res, fmt.Errorf("drop expired webhook event partition %s: %w", p.Name, err)
		}
		res.Dropped = append(res.Dropped, p.Name)
	}
	// A partition detached but not dropped (a crash in between): nothing
	// reads it any more, and it was detached only when fully processed.
	leftovers, err := pgpartition.Detached(ctx, conn, `^stripe_webhook_events_(legacy|before_[0-9_]+|[0-9_]+)$`)
	if err != nil {
		return res, err
	}
	for _, name := range leftovers {
		n, err := unprocessed(ctx, conn, name)
		if err != nil {
			return res, err
		}
		if n > 0 {
			res.Kept = append(res.Kept, Kept{Name: name, Unprocessed: n})
			continue
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf(`DROP TABLE %s`, name)); err != nil {
			return res, fmt.Errorf("drop detached webhook event partition %s: %w", name, err)
		}
		res.Dropped = append(res.Dropped, name)
	}
	return res, nil
}

// unprocessed counts a partition's unprocessed events (its partial index
// on seq, as small as the backlog).
func unprocessed(ctx context.Context, db overage.DB, partition string) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE processed_at IS NULL`, partition)).Scan(&n); err != nil {
		return 0, fmt.Errorf("count unprocessed events of %s: %w", partition, err)
	}
	return n, nil
}

// Maintain drops the expired partitions and creates the missing ones: what
// `overage work` runs every 10 minutes (webhooks.Reaper). Before 0046 has
// partitioned the table it does nothing.
func Maintain(ctx context.Context, pool *pgxpool.Pool, retention time.Duration, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ok, err := partitioned(ctx, pool)
	if err != nil || !ok {
		return err
	}
	res, err := DropExpired(ctx, pool, retention)
	for _, name := range res.Dropped {
		logger.InfoContext(ctx, "expired webhook events dropped", "partition", name)
	}
	for _, k := range res.Kept {
		logger.WarnContext(ctx, "webhook event partition past retention kept: it holds unprocessed events",
			"partition", k.Name, "count", k.Unprocessed)
	}
	if err != nil {
		return err
	}
	created, err := Ensure(ctx, pool)
	for _, name := range created {
		logger.InfoContext(ctx, "webhook event partition created", "partition", name)
	}
	return err
}
