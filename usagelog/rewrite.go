package usagelog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// rewrite is a month's partition copied into a new table and swapped
// in for it, which gives back the space billing's dead versions leave in
// its heap (VACUUM only marks it free for the month's later logs, which
// do not come).
//
// VACUUM FULL or CLUSTER would do it in place, but they hold ACCESS
// EXCLUSIVE on the partition for the whole rewrite, and every generic
// plan of a statement on usage_logs locks every partition before it
// prunes them (ingest's request_id probes among them): ingest would stop
// for minutes. Here, nothing waits for longer than the swap:
//
//  1. capture: a row trigger on the partition (usage_log_pack_capture,
//     migration 0071) records the id of every log written from now on
//     into a table of changed ids. Creating it takes SHARE ROW EXCLUSIVE
//     on the partition, which waits for the month's writers (a review
//     resolving logs of it, say) and makes the month's new writers wait;
//     under a short lock_timeout, tried again, so they wait no longer
//     than that. Reads and the other months are not touched.
//  2. copy: a new table like the partition, its logs copied in id order,
//     then its indexes built from the partition's definitions (at
//     PackFillfactor, set before), then analysed. Only ACCESS SHARE on
//     the partition: the month is read and written meanwhile; what is
//     written is captured.
//  3. swap, one transaction: ACCESS EXCLUSIVE on usage_logs under a short
//     lock_timeout, tried again (ingest waits at most that long for each
//     try, and for the swap: milliseconds); the captured logs copied
//     again; the partition detached and dropped; the copy renamed to its
//     name, its indexes to the partition's index names, and attached in
//     its range, which a CHECK constraint of that range lets ATTACH
//     accept without reading it.
//
// A crash or an error at any step leaves the partition as it was (the
// swap is one transaction) with leftovers the next pack drops first.
type rewrite struct {
	db *pgx.Conn
	p  Partition
}

// swapLockTimeout bounds each wait for a lock that makes others wait:
// the capture trigger's on the partition and the swap's on usage_logs.
// swapTries of them, swapPause apart, before the pack gives up (retention
// tries again on its next run).
const (
	swapLockTimeout = 200 * time.Millisecond
	swapTries       = 60
	swapPause       = time.Second
)

// captureTrigger names the trigger of step 1 on the partition.
const captureTrigger = "usage_log_pack_capture"

func (r rewrite) copyName() string    { return r.p.Name + "_pack" }
func (r rewrite) changesName() string { return r.p.Name + "_pack_changes" }
func (r rewrite) boundName() string   { return r.p.Name + "_pack_bound" }
func (r rewrite) tmpIndex(i int) string {
	return fmt.Sprintf("%s_pack_i%d", r.p.Name, i)
}

// afterCopy, when set (by a test), runs between the copy and the swap.
var afterCopy func()

func (r rewrite) run(ctx context.Context) error {
	if err := r.capture(ctx); err != nil {
		return err
	}
	indexes, err := r.copyLogs(ctx)
	if err != nil {
		return err
	}
	if afterCopy != nil {
		afterCopy()
	}
	return r.swap(ctx, indexes)
}

// withLock runs f in a transaction whose every lock wait is bounded by
// swapLockTimeout, up to swapTries times until none times out.
func (r rewrite) withLock(ctx context.Context, what string, f func(tx pgx.Tx) error) error {
	for try := 1; ; try++ {
		err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, swapLockTimeout.Milliseconds())); err != nil {
				return fmt.Errorf("set lock_timeout: %w", err)
			}
			return f(tx)
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" || try == swapTries { // lock_not_available
			if err != nil {
				return fmt.Errorf("%s (try %d): %w", what, try, err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(swapPause):
		}
	}
}

func (r rewrite) capture(ctx context.Context) error {
	return r.withLock(ctx, "capture the month's writes", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE `+ident(r.changesName())+` (id uuid NOT NULL)`); err != nil {
			return err
		}
		// The trigger's argument is the table's name; its function
		// quotes it (%I).
		_, err := tx.Exec(ctx, fmt.Sprintf(`CREATE TRIGGER %s AFTER INSERT OR UPDATE OR DELETE ON %s
			FOR EACH ROW EXECUTE FUNCTION usage_log_pack_capture(%s)`,
			ident(captureTrigger), ident(r.p.Name), quoteLiteral(r.changesName())))
		return err
	})
}

// index is one index of the partition and what the copy calls it.
type index struct {
	name, tmp string
	primary   bool
}

// copyLogs makes the copy, with the partition's logs in id order and its
// indexes, and returns those indexes.
func (r rewrite) copyLogs(ctx context.Context) ([]index, error) {
	// The range is read from the catalogue, not from r.p: the CHECK is
	// the partition constraint itself, so ATTACH finds it implied.
	var opts []string
	var bound string
	if err := r.db.QueryRow(ctx, `SELECT coalesce(reloptions, '{}'), pg_get_partition_constraintdef(oid)
		FROM pg_class WHERE oid = $1::regclass`, r.p.Name).Scan(&opts, &bound); err != nil {
		return nil, fmt.Errorf("read the options and range of %s: %w", r.p.Name, err)
	}
	with := ""
	if len(opts) > 0 {
		with = " WITH (" + strings.Join(opts, ", ") + ")"
	}
	// LIKE the partition, not usage_logs: its columns in its order, so
	// SELECT * copies it (a dropped column is neither read nor made).
	for _, q := range []string{
		`CREATE TABLE ` + ident(r.copyName()) + ` (LIKE ` + ident(r.p.Name) + ` INCLUDING ALL EXCLUDING INDEXES)` + with,
		`ALTER TABLE ` + ident(r.copyName()) + ` ADD CONSTRAINT ` + ident(r.boundName()) + ` CHECK (` + bound + `)`,
		`INSERT INTO ` + ident(r.copyName()) + ` SELECT * FROM ` + ident(r.p.Name) + ` ORDER BY id`,
	} {
		if _, err := r.db.Exec(ctx, q); err != nil {
			return nil, fmt.Errorf("copy %s: %w", r.p.Name, err)
		}
	}
	rows, err := r.db.Query(ctx, `SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisunique, i.indisprimary
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = $1::regclass ORDER BY c.relname`, r.p.Name)
	if err != nil {
		return nil, fmt.Errorf("read the indexes of %s: %w", r.p.Name, err)
	}
	type def struct {
		index
		unique bool
		using  string
	}
	defs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (def, error) {
		var d def
		var text string
		if err := row.Scan(&d.name, &text, &d.unique, &d.primary); err != nil {
			return d, err
		}
		// "CREATE [UNIQUE] INDEX name ON table USING method (…) [WITH …]
		// [WHERE …]": only what follows USING is kept; names hold no
		// " USING ".
		var ok bool
		if _, d.using, ok = strings.Cut(text, " USING "); !ok {
			return d, fmt.Errorf("index %s: cannot read its definition %q", d.name, text)
		}
		return d, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the indexes of %s: %w", r.p.Name, err)
	}
	var out []index
	for i, d := range defs {
		d.tmp = r.tmpIndex(i)
		create := `CREATE INDEX `
		if d.unique {
			create = `CREATE UNIQUE INDEX `
		}
		if _, err := r.db.Exec(ctx, create+ident(d.tmp)+` ON `+ident(r.copyName())+` USING `+d.using); err != nil {
			return nil, fmt.Errorf("copy %s: index %s: %w", r.p.Name, d.name, err)
		}
		if d.primary {
			if _, err := r.db.Exec(ctx, `ALTER TABLE `+ident(r.copyName())+` ADD CONSTRAINT `+ident(d.tmp)+` PRIMARY KEY USING INDEX `+ident(d.tmp)); err != nil {
				return nil, fmt.Errorf("copy %s: primary key: %w", r.p.Name, err)
			}
		}
		out = append(out, d.index)
	}
	// Statistics of its own: the partition's go with it, and the copy's
	// inserts would have autovacuum analyse it soon, but not before
	// queries of the month are planned on it.
	if _, err := r.db.Exec(ctx, `ANALYZE `+ident(r.copyName())); err != nil {
		return nil, fmt.Errorf("copy %s: analyze: %w", r.p.Name, err)
	}
	return out, nil
}

// swap puts the copy in the partition's place.
func (r rewrite) swap(ctx context.Context, indexes []index) error {
	return r.withLock(ctx, "swap in the copy", func(tx pgx.Tx) error {
		// The parent first, as every writer locks it before a partition;
		// LOCK recurses to every partition.
		if _, err := tx.Exec(ctx, `LOCK TABLE usage_logs IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		var forValues string // "FOR VALUES FROM (…) TO (…)"
		if err := tx.QueryRow(ctx, `SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE oid = $1::regclass`, r.p.Name).Scan(&forValues); err != nil {
			return fmt.Errorf("read the range of %s: %w", r.p.Name, err)
		}
		copyT, part, changes := ident(r.copyName()), ident(r.p.Name), ident(r.changesName())
		qs := []string{
			// Counted first, so that the two statements after it probe
			// the month by id rather than read it whole while ingest
			// waits.
			`ANALYZE ` + changes,
			`DELETE FROM ` + copyT + ` WHERE id IN (SELECT id FROM ` + changes + `)`,
			`INSERT INTO ` + copyT + ` SELECT * FROM ` + part + ` WHERE id IN (SELECT id FROM ` + changes + `)`,
			`ALTER TABLE usage_logs DETACH PARTITION ` + part,
			`DROP TABLE ` + part + `, ` + changes,
			`ALTER TABLE ` + copyT + ` RENAME TO ` + part,
		}
		for _, ix := range indexes {
			qs = append(qs, `ALTER INDEX `+ident(ix.tmp)+` RENAME TO `+ident(ix.name))
		}
		qs = append(qs,
			`ALTER TABLE usage_logs ATTACH PARTITION `+part+` `+forValues,
			`ALTER TABLE `+part+` DROP CONSTRAINT `+ident(r.boundName()))
		for _, q := range qs {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", firstWords(q), err)
			}
		}
		return nil
	})
}

// dropLeftovers drops what an interrupted rewrite of the partition left:
// the copy, the table of changed ids and the trigger that fills it.
func (r rewrite) dropLeftovers(ctx context.Context) error {
	var copyExists, changesExists, triggerExists bool
	if err := r.db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL,
			EXISTS (SELECT FROM pg_trigger WHERE tgrelid = to_regclass($3) AND tgname = $4)`,
		r.copyName(), r.changesName(), r.p.Name, captureTrigger).Scan(&copyExists, &changesExists, &triggerExists); err != nil {
		return fmt.Errorf("read what an earlier pack left: %w", err)
	}
	if copyExists {
		// Nothing but this reads it: no lock to wait for.
		if _, err := r.db.Exec(ctx, `DROP TABLE `+ident(r.copyName())); err != nil {
			return fmt.Errorf("drop an earlier pack's copy: %w", err)
		}
	}
	if !changesExists && !triggerExists {
		return nil
	}
	// DROP TRIGGER locks the partition as the swap locks usage_logs.
	return r.withLock(ctx, "drop an earlier pack's trigger", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DROP TRIGGER IF EXISTS `+ident(captureTrigger)+` ON `+ident(r.p.Name)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+ident(r.changesName()))
		return err
	})
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// firstWords is the start of a statement, for an error.
func firstWords(q string) string {
	if len(q) > 60 {
		return q[:60] + "…"
	}
	return q
}
