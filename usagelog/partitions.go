package usagelog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/pgpartition"
)

// Partitions of usage_logs and usage_reports (migrations 0054-0059).
//
// usage_logs is partitioned by RANGE (id) and usage_reports by RANGE
// (lead_usage_log_id), with the same bounds: a usage log's id is a UUIDv7
// minted when ingest records it, so a range of ids is a range of ingest
// time, and a report goes with its lead log's range. A partition covers a
// UTC month, `usage_logs_pYYYYMM` and `usage_reports_pYYYYMM`, its bounds
// being IDFloor of the months' first instants; the first partitions,
// `usage_logs_legacy` and `usage_reports_legacy` (the tables as they were
// before 0058), cover every id below the first month's. Partitions are
// created ahead of time, hourly by `overage work` and at `overage migrate`
// (EnsurePartitions); dropping them is retention's.
//
// Each usage_logs partition has its own unique index on request_id: a
// unique index of the partitioned table would have to include id. Since
// migration 0067 it is `<partition>_request_key` on one 16-byte column,
// the digest of tenant and request_id (RequestKeySQL): an entry is 28
// bytes with its line pointer, where one of 0061's
// `<partition>_request_digest` on (tenant_id, md5(request_id)::uuid)
// (RequestDigestSQL) is 44, and one on (tenant_id, request_id) before it
// 60 or more (docs/benchmarks.md, "One digest of tenant and request_id").
// A partition made before and holding logs keeps its index until it is
// dropped, and the lookups state every index's condition (RequestIDIs). Across the bound of two partitions the
// claims of ClaimRequestIDsSQL referee instead, within ClaimWindow of
// every bound.

// The names of the unique indexes on request_id end so: since 0067, from
// 0061 to 0067, before 0061 (the first partition's was
// usage_logs_tenant_request_id before 0058).
const (
	RequestKeyIndexSuffix    = "_request_key"
	RequestDigestIndexSuffix = "_request_digest"
	RequestIDIndexSuffix     = "_request_id"
)

// PartitionDB is a pool or a connection: partitions are kept from both.
type PartitionDB interface {
	overage.DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Ahead is how many UTC months of partitions beyond the current one are
// kept ready, so ingest goes on for two months should no `overage work`
// run.
const Ahead = 2

// ClaimWindow is how near a partition bound (by the database's clock) an
// ingest transaction claims the request_ids it records in
// usage_log_request_claims: wider than any plausible skew between the
// clocks of the app servers (which mint the ids) and the database's, plus
// the longest ingest transaction.
const ClaimWindow = time.Hour

// Partition is one range of usage log ids: its usage_logs partition and
// the usage_reports partition of the same range.
type Partition struct {
	// Name is the usage_logs partition; Reports the usage_reports one of
	// the same bounds ("" if there is none: not made yet by a crash
	// between the two, which EnsurePartitions does not mend).
	Name    string
	Reports string
	// Logs in it were recorded at or after Lower (nil: the first
	// partition, which spans every id before Upper) and before Upper, by
	// their ids (IDTime); LowerID and UpperID are the bounds themselves.
	Lower   *time.Time
	Upper   time.Time
	LowerID *uuid.UUID
	UpperID uuid.UUID
}

// lockID serialises partition changes of concurrent workers and migrators
// ("ovg-ulog" read as a big-endian integer).
const lockID int64 = 0x6f76672d756c6f67

// IDFloor is the smallest UUIDv7 of t's millisecond: its 48-bit Unix
// millisecond timestamp, every other bit zero. Every id minted at or after
// t is at or above it.
func IDFloor(t time.Time) uuid.UUID {
	var id uuid.UUID
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.UnixMilli()))
	copy(id[:6], ms[2:])
	return id
}

// IDTime is the instant a UUIDv7 was minted at, to the millisecond.
func IDTime(id uuid.UUID) time.Time {
	var ms [8]byte
	copy(ms[2:], id[:6])
	return time.UnixMilli(int64(binary.BigEndian.Uint64(ms[:]))).UTC()
}

// boundsSQL lists the usage_logs partitions with their bounds (NULL for
// MINVALUE) and the usage_reports partition of the same bounds, oldest
// first.
const boundsSQL = `WITH p AS (
		SELECT i.inhparent, c.relname,
			(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)'))[1]::uuid AS lower,
			(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::uuid AS upper
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent IN ('usage_logs'::regclass, 'usage_reports'::regclass))
	SELECT l.relname, coalesce(r.relname, ''), l.lower, l.upper
	FROM p l LEFT JOIN p r ON r.inhparent = 'usage_reports'::regclass
		AND r.lower IS NOT DISTINCT FROM l.lower AND r.upper = l.upper
	WHERE l.inhparent = 'usage_logs'::regclass
	ORDER BY l.upper`

// Partitions lists the partitions of usage_logs, oldest first, each with
// the usage_reports partition of its range.
func Partitions(ctx context.Context, db overage.DB) ([]Partition, error) {
	rows, err := db.Query(ctx, boundsSQL)
	if err != nil {
		return nil, fmt.Errorf("list usage log partitions: %w", err)
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Partition, error) {
		var p Partition
		if err := r.Scan(&p.Name, &p.Reports, &p.LowerID, &p.UpperID); err != nil {
			return p, err
		}
		if p.LowerID != nil {
			l := IDTime(*p.LowerID)
			p.Lower = &l
		}
		p.Upper = IDTime(p.UpperID)
		return p, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list usage log partitions: %w", err)
	}
	return ps, nil
}

// covers reports whether p holds the logs recorded at t.
func (p Partition) covers(t time.Time) bool {
	return (p.Lower == nil || !t.Before(*p.Lower)) && t.Before(p.Upper)
}

// partitionSuffix names the partition starting at lower: pYYYYMM for a
// month, the full instant for any other bound (tests make such).
func partitionSuffix(lower time.Time) string {
	lower = lower.UTC()
	if lower.Equal(time.Date(lower.Year(), lower.Month(), 1, 0, 0, 0, 0, time.UTC)) {
		return "p" + lower.Format("200601")
	}
	return "p" + lower.Format("20060102150405") + fmt.Sprintf("%03d", lower.Nanosecond()/1e6)
}

// AddPartition creates the usage_logs and usage_reports partitions of the
// ids recorded from lower to upper (to the millisecond) and returns the
// usage_logs one's name. EnsurePartitions makes months; a test may make any
// range not covered yet. Each is made empty and apart, with the unique
// index on the digest of tenant and request_id (RequestKeySQL), then attached: ATTACH takes only a SHARE UPDATE
// EXCLUSIVE lock on the partitioned table, so ingest reads and writes on
// meanwhile.
func AddPartition(ctx context.Context, db PartitionDB, lower, upper time.Time) (string, error) {
	var name string
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lockPartitions(ctx, tx); err != nil {
			return err
		}
		var err error
		name, err = addPartition(ctx, tx, lower, upper)
		return err
	})
	return name, err
}

func lockPartitions(ctx context.Context, tx pgx.Tx) error {
	return pgpartition.Lock(ctx, tx, lockID, "usage log")
}

func addPartition(ctx context.Context, tx pgx.Tx, lower, upper time.Time) (string, error) {
	suffix := partitionSuffix(lower)
	logs, reports := "usage_logs_"+suffix, "usage_reports_"+suffix
	from, to := IDFloor(lower), IDFloor(upper)
	for _, q := range []string{
		// The checks come with LIKE (ATTACH wants them there); the
		// foreign key of usage_reports is cloned by ATTACH. Fillfactor
		// 100: billing changes billing_status, in the predicates of
		// partial indexes, so its updates are not HOT whatever free space
		// a page keeps (about one in ten was at 80); full pages cost a
		// billed log about 55 bytes less after VACUUM and bill no slower
		// (docs/benchmarks.md, "A batched usage log").
		fmt.Sprintf(`CREATE TABLE %s (LIKE usage_logs INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION)
			WITH (fillfactor = 100)`, logs),
		fmt.Sprintf(`CREATE UNIQUE INDEX %s`+RequestKeyIndexSuffix+` ON %s ((`+RequestKeySQL+`)) WHERE request_id IS NOT NULL`, logs, logs),
		fmt.Sprintf(`ALTER TABLE usage_logs ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`, logs, from, to),
		fmt.Sprintf(`CREATE TABLE %s (LIKE usage_reports INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION)`, reports),
		fmt.Sprintf(`ALTER TABLE usage_reports ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`, reports, from, to),
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return "", fmt.Errorf("create usage log partition %s: %w", logs, err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO usage_log_partition_bounds (lower) VALUES ($1) ON CONFLICT DO NOTHING`,
		lower.UTC().Truncate(time.Millisecond)); err != nil {
		return "", fmt.Errorf("record the bound of usage log partition %s: %w", logs, err)
	}
	return logs, nil
}

// EnsurePartitions creates the missing month partitions from the current
// UTC month (by the database's clock) to Ahead months beyond it, and
// returns the names of the usage_logs ones it created. A month already
// covered (by the first partition, which spans months) is skipped; a month
// partly covered (a test's bounds) gets the part before the next bound.
func EnsurePartitions(ctx context.Context, db PartitionDB) ([]string, error) {
	var created []string
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lockPartitions(ctx, tx); err != nil {
			return err
		}
		var err error
		created, err = ensureMonths(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return created, nil
}

// FitFirstPartition ends the first partitions (usage_logs_legacy and
// usage_reports_legacy) at the current UTC month when they hold nothing,
// then creates the months from there as EnsurePartitions does, in one
// transaction; it reports whether it refitted them. It is for a new
// database (`overage migrate` runs it): migration 0058 made the table as
// it was the partition of every id below a bound months ahead of the
// migration, so a new deployment would otherwise write its first two or
// three months into that one partition, whose indexes grow all that time
// (the unique index on request_id takes every log of them at random
// places: at 20 million logs, most of what ingest writes there dirties a
// page it must first read, and writes it whole to the WAL after each
// checkpoint) and which retention can drop only when the last of those
// months is past. Refitted, each month has its partition from the first
// day, as on a database that has run a while. Partitions that hold a log
// or a report are left as they are: their rows stay where they are.
//
// The first partitions are locked (ACCESS EXCLUSIVE, under lock_timeout)
// before they are looked at: an ingest routing a log to them waits, and
// once this commits its log goes to the month's partition, made in the
// same transaction.
func FitFirstPartition(ctx context.Context, db PartitionDB) (bool, []string, error) {
	var (
		fitted  bool
		created []string
	)
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lockPartitions(ctx, tx); err != nil {
			return err
		}
		var month time.Time
		if err := tx.QueryRow(ctx, `SELECT date_trunc('month', now(), 'UTC')`).Scan(&month); err != nil {
			return fmt.Errorf("read the database clock: %w", err)
		}
		ps, err := Partitions(ctx, tx)
		if err != nil {
			return err
		}
		if len(ps) > 0 && ps[0].Lower == nil && ps[0].Reports != "" && ps[0].Upper.After(month) {
			first := ps[0]
			fitted, err = pgpartition.EndEmptyFirst(ctx, tx, []pgpartition.Table{
				{Parent: "usage_logs", Name: first.Name}, {Parent: "usage_reports", Name: first.Reports}}, IDFloor(month).String())
			if err != nil {
				return err
			}
		}
		created, err = ensureMonths(ctx, tx)
		return err
	})
	if err != nil {
		return false, nil, err
	}
	return fitted, created, nil
}

// ensureMonths is EnsurePartitions in tx, which holds lockPartitions.
func ensureMonths(ctx context.Context, tx pgx.Tx) ([]string, error) {
	var created []string
	var month time.Time
	if err := tx.QueryRow(ctx, `SELECT date_trunc('month', now(), 'UTC')`).Scan(&month); err != nil {
		return nil, fmt.Errorf("read the database clock: %w", err)
	}
	ps, err := Partitions(ctx, tx)
	if err != nil {
		return nil, err
	}
months:
	for m := month.UTC(); !m.After(month.UTC().AddDate(0, Ahead, 0)); m = m.AddDate(0, 1, 0) {
		upper := m.AddDate(0, 1, 0)
		for _, p := range ps {
			if p.covers(m) {
				continue months
			}
			if p.Lower != nil && p.Lower.After(m) && p.Lower.Before(upper) {
				upper = *p.Lower
			}
		}
		name, err := addPartition(ctx, tx, m, upper)
		if err != nil {
			return nil, err
		}
		created = append(created, name)
	}
	return created, nil
}

// TruncateClaims empties usage_log_request_claims when no partition bound
// is within 2 × ClaimWindow of now (by the database's clock) and reports
// whether it did: every transaction that claimed has long ended, and none
// claims again before the next bound's window. TRUNCATE waits for the
// ingest transactions holding the table (milliseconds) and makes new ones
// wait behind it, so it gives up after 100 ms and is tried again on the
// next run rather than stall ingest.
func TruncateClaims(ctx context.Context, db PartitionDB) (bool, error) {
	var done bool
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lockPartitions(ctx, tx); err != nil {
			return err
		}
		var due bool
		if err := tx.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM usage_log_partition_bounds
				WHERE lower BETWEEN now() - $1 * interval '1 second' AND now() + $1 * interval '1 second')
			AND EXISTS (SELECT FROM usage_log_request_claims)`, (2 * ClaimWindow).Seconds()).Scan(&due); err != nil {
			return fmt.Errorf("read whether request_id claims are due to go: %w", err)
		}
		if !due {
			return nil
		}
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '100ms'`); err != nil {
			return fmt.Errorf("set lock_timeout: %w", err)
		}
		if _, err := tx.Exec(ctx, `TRUNCATE usage_log_request_claims`); err != nil {
			return fmt.Errorf("truncate request_id claims: %w", err)
		}
		done = true
		return nil
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available: the next run tries again
		return false, nil
	}
	return done, err
}

// Maintain creates the missing partitions and empties the request_id
// claims past their window: what `overage work` runs every hour.
func Maintain(ctx context.Context, db PartitionDB, logger *slog.Logger) error {
	created, err := EnsurePartitions(ctx, db)
	for _, name := range created {
		logger.InfoContext(ctx, "usage log partition created", "partition", name)
	}
	if err != nil {
		return err
	}
	truncated, err := TruncateClaims(ctx, db)
	if truncated {
		logger.InfoContext(ctx, "request_id claims emptied after their partition bound")
	}
	return err
}
