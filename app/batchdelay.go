package app

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// REPORT_BATCH_DELAY is the period of the report jobs: serve queues a
// tenant's job for the period an event falls in, and work's sweep and
// report runs queue theirs for their own periods. With two values the
// periods do not line up, so a tenant's logs are reported in more jobs
// and more Stripe calls than either value would make; nothing is billed
// twice (a meter event is keyed by a usage log's id), so a mismatch is
// logged as an error rather than refused. Refusing would also make the
// value impossible to change in a rolling deploy: each new process would
// meet an old one still running with the old value.
//
// Each serve and work process holds, for its lifetime, a shared
// session-level advisory lock whose key is its role and its delay, on a
// connection of its own; the lock goes with the process, however it ends,
// so only live processes are compared and no table is needed.
// pg_locks shows every holder's key to every role. A server that closes
// idle sessions (idle_session_timeout) ends a claim early: the check is
// then blind to that process, never wrong about a live one.

// batchDelayLockClass is the first key of the two-key advisory locks of
// delayRoles: "ovgb" and the role's index. Ingest's two-key locks are
// hashes, 2^-32 likely to share a first key.
const batchDelayLockClass = 0x6f766762

// delayRoles are the processes that hold a batch delay lock.
var delayRoles = []string{"serve", "work", "dev"}

// BatchDelayClaim is a process's claim of its REPORT_BATCH_DELAY; Close
// releases it.
type BatchDelayClaim struct {
	conn *pgx.Conn
}

// ClaimBatchDelay records, on the database dbURL names, that a process of
// role (serve, work or dev) runs with delay, and returns the delays the
// other live processes run with that differ from it. Only a whole number
// of milliseconds is compared (up to 24 days).
func ClaimBatchDelay(ctx context.Context, dbURL, role string, delay time.Duration) (*BatchDelayClaim, []OtherDelay, error) {
	idx := -1
	for i, r := range delayRoles {
		if r == role {
			idx = i
		}
	}
	if idx < 0 {
		return nil, nil, fmt.Errorf("claim REPORT_BATCH_DELAY: unknown role %q", role)
	}
	// pgxpool's parser: it takes the pools' settings (pool_max_conns) out
	// of the URL, which the server would refuse as parameters.
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, nil, fmt.Errorf("DATABASE_URL: %w", RedactParseError(err))
	}
	cc := pc.ConnConfig
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 5 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, nil, fmt.Errorf("claim REPORT_BATCH_DELAY: connect to PostgreSQL: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock_shared($1::int4, $2::int4)`, int32(batchDelayLockClass+idx), int32(delayMillis(delay))); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("claim REPORT_BATCH_DELAY: %w", err)
	}
	others, err := otherDelays(ctx, conn, delay)
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("claim REPORT_BATCH_DELAY: %w", err)
	}
	return &BatchDelayClaim{conn: conn}, others, nil
}

// otherDelays are the delays of the live claims on db's database that
// differ from delay.
func otherDelays(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, delay time.Duration) ([]OtherDelay, error) {
	// classid and objid are the two keys as oids (their bits unsigned).
	rows, err := db.Query(ctx, `SELECT DISTINCT classid::bigint - $1, objid::bigint FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 2 AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid::bigint BETWEEN $1 AND $2 AND objid::bigint <> $3
		ORDER BY 1, 2`, int64(batchDelayLockClass), int64(batchDelayLockClass+len(delayRoles)-1), delayMillis(delay))
	if err != nil {
		return nil, fmt.Errorf("read the live processes' REPORT_BATCH_DELAY: %w", err)
	}
	others, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OtherDelay, error) {
		var i, ms int64
		err := r.Scan(&i, &ms)
		return OtherDelay{Role: delayRoles[i], Delay: time.Duration(ms) * time.Millisecond}, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the live processes' REPORT_BATCH_DELAY: %w", err)
	}
	return others, nil
}

// delayMillis is the lock's second key: delay in whole milliseconds.
func delayMillis(delay time.Duration) int64 { return min(delay.Milliseconds(), math.MaxInt32) }

// OtherDelay is the REPORT_BATCH_DELAY of another live process.
type OtherDelay struct {
	Role  string
	Delay time.Duration
}

// Close releases the claim (closing its connection).
func (c *BatchDelayClaim) Close() {
	if c != nil {
		_ = c.conn.Close(context.Background())
	}
}

// BatchDelayMismatch is the error message for others running with other
// delays than delay, or "" when there are none.
func BatchDelayMismatch(role string, delay time.Duration, others []OtherDelay) string {
	if len(others) == 0 {
		return ""
	}
	var them []string
	for _, o := range others {
		them = append(them, fmt.Sprintf("a %s process with %s", o.Role, o.Delay))
	}
	return fmt.Sprintf("REPORT_BATCH_DELAY disagrees: this %s runs with %s, but %s runs on this database; give every process the same (with two values a tenant's logs are reported in more jobs and Stripe calls than either would make, never twice)",
		role, delay, strings.Join(them, " and "))
}

// CheckBatchDelay claims delay for role and logs an error naming both
// values when a live process runs with another one. Only a database that
// cannot be reached fails the start.
func CheckBatchDelay(ctx context.Context, dbURL, role string, delay time.Duration, logger *slog.Logger) (*BatchDelayClaim, error) {
	claim, others, err := ClaimBatchDelay(ctx, dbURL, role, delay)
	if err != nil {
		return nil, err
	}
	if msg := BatchDelayMismatch(role, delay, others); msg != "" {
		logger.Error(msg, "report_batch_delay", delay)
	}
	return claim, nil
}
