package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/workers"
)

// Default pool sizes, a connection budget: two `serve` and two `work`
// replicas, and a CLI command, fit in PostgreSQL's default
// max_connections (100, of which 3 are reserved for superusers) with room
// for an operator's psql and a second command: 2 x 19 + 2 x 25 + 4 = 92
// of 97, 5 left. Neither process needs many: an ingest transaction holds
// its connection for a millisecond or two and coalesces a tenant's
// events, and a report job holds none while it waits for Stripe, so past
// about twice the database's cores more connections only queue inside
// PostgreSQL instead of in the pool (docs/limits.md has the
// measurements). A size given in DATABASE_URL (pool_max_conns) wins, for
// every pool of the process.
const (
	// ServeAPIMaxConns is the pool of ingest, tenants and webhooks.
	ServeAPIMaxConns = 14
	// ServeAdminMaxConns is the pool of the finance statement: slow statements
	// hold at most these, never a connection ingest needs.
	ServeAdminMaxConns = 3
	// ServeMetricsMaxConns is the pool of /metrics' backlog gauges, read
	// at most once per metrics.BacklogCacheTTL.
	ServeMetricsMaxConns = 1
	// BatchDelayConns is the idle connection, outside the pools, that
	// holds a serve's or work's claim of its REPORT_BATCH_DELAY
	// (batchdelay.go).
	BatchDelayConns = 1
	// ServeMaxConns is every connection one `serve` may open.
	ServeMaxConns = ServeAPIMaxConns + ServeAdminMaxConns + ServeMetricsMaxConns + BatchDelayConns
	// WorkPoolMaxConns is the pool of the workers' own statements in one
	// `work`: report jobs, webhooks and alerts. Billing's 200 report
	// workers may hold all of it; River's statements and the maintenance
	// queue's are not in it.
	WorkPoolMaxConns = 18
	// MaintenancePoolMaxConns is the pool of the maintenance queue's jobs
	// in one `work` (workers.Config.MaintenancePool): the sweep, the
	// partitions kept ahead and dropped, retention, idle streams: one
	// connection for each job its queue runs at once. Apart from
	// WorkPoolMaxConns, billing
	// holding every connection of that pool cannot delay the partitions
	// ingest needs ahead; and its backends carry their own
	// application_name (MaintenanceAppName), so an operator, and
	// bench/expiry, can tell what maintenance costs the database.
	MaintenancePoolMaxConns = workers.MaintenanceWorkers
	// RiverPoolMaxConns is the pool of River's own statements in one
	// `work` (workers.Config.RiverPool): each queue's producer fetches one
	// batch of jobs at a time and polls its settings, the completer marks
	// finished jobs in batches one statement at a time, the elector
	// tries for or keeps the leadership every few seconds, and the leader
	// enqueues the periodic jobs and runs River's maintenance. Each is a
	// statement of milliseconds, not a connection held: a job holds none
	// of River's while it runs (River v0.51.2's executor works it with no
	// connection and hands the result to the completer), so demand does
	// not grow with REPORT_WORKERS, and three serve these with a slot
	// to spare while one waits. Apart from WorkPoolMaxConns, billing
	// cannot starve leader election, and with it the periodic jobs that
	// keep the idempotency partitions ahead.
	RiverPoolMaxConns = 3
	// RiverListenerConns is River's listener (LISTEN for new jobs and
	// leadership changes): it takes a connection from River's pool and
	// hijacks it, so it is one more than RiverPoolMaxConns, held for the
	// process's life.
	RiverListenerConns = 1
	// WorkMaxConns is every connection one `work` may open.
	WorkMaxConns = WorkPoolMaxConns + MaintenancePoolMaxConns + RiverPoolMaxConns + RiverListenerConns + BatchDelayConns
	// ToolMaxConns is the pool of a CLI command.
	ToolMaxConns = 4
)

// The application_name of each pool of `work` and `serve`, as
// pg_stat_activity shows its backends: what each costs the database can
// be read apart.
const (
	WorkAppName         = "overage-work"
	MaintenanceAppName  = "overage-maintenance"
	RiverAppName        = "overage-river"
	ServeAppName        = "overage-serve"         // the API's pool: ingest, tenants, webhooks
	ServeAdminAppName   = "overage-serve-admin"   // the finance statement
	ServeMetricsAppName = "overage-serve-metrics" // /metrics' backlog gauges
)

// OpenPool connects to PostgreSQL with at most maxConns connections. Sizes
// and timeouts given in the URL (pool_max_conns, connect_timeout) win.
func OpenPool(ctx context.Context, databaseURL string, maxConns int32) (*pgxpool.Pool, error) {
	return OpenPoolAs(ctx, databaseURL, maxConns, "")
}

// OpenPoolAs is OpenPool whose connections carry appName as their
// application_name, unless DATABASE_URL or PGAPPNAME names one.
func OpenPoolAs(ctx context.Context, databaseURL string, maxConns int32, appName string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", RedactParseError(err))
	}
	if !strings.Contains(databaseURL, "pool_max_conns") {
		pc.MaxConns = maxConns
	}
	if _, named := pc.ConnConfig.RuntimeParams["application_name"]; !named && appName != "" {
		pc.ConnConfig.RuntimeParams["application_name"] = appName
	}
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return pool, nil
}

// RedactParseError keeps a connection string's password out of errors:
// pgconn's message quotes the whole string, so none of it is kept.
func RedactParseError(error) error {
	return errors.New("cannot parse the connection string (want postgres://USER@HOST:PORT/DATABASE or key=value pairs)")
}

// ConnectionBudget is what the server allows against what a process's
// pools may open.
type ConnectionBudget struct {
	// MaxConnections is the server's max_connections.
	MaxConnections int
	// Reserved are the connections only superusers may take
	// (superuser_reserved_connections, and reserved_connections from
	// PostgreSQL 16).
	Reserved int
	// Others are the client connections open now that are not this
	// process's.
	Others int
	// Pools is the most this process's pools may open.
	Pools int
}

// Usable is how many connections ordinary roles may open.
func (b ConnectionBudget) Usable() int { return b.MaxConnections - b.Reserved }

// Problem says why the pools may not get their connections, or "".
func (b ConnectionBudget) Problem() string {
	switch {
	case b.Pools > b.Usable():
		return fmt.Sprintf("this process's pools may open %d connections, more than the %d the server allows (max_connections %d, %d reserved): lower pool_max_conns in DATABASE_URL or raise max_connections",
			b.Pools, b.Usable(), b.MaxConnections, b.Reserved)
	case b.Pools+b.Others > b.Usable():
		return fmt.Sprintf("this process's pools may open %d connections and %d are held by other clients, more than the %d the server allows (max_connections %d, %d reserved): a request may wait for a connection, or fail, when the pools fill; see docs/limits.md",
			b.Pools, b.Others, b.Usable(), b.MaxConnections, b.Reserved)
	}
	return ""
}

// ReadConnectionBudget reads the server's limits through pool, for pools
// that may open poolConns connections in all (the caller's own open
// connections are not counted among the others').
func ReadConnectionBudget(ctx context.Context, pool *pgxpool.Pool, poolConns int) (ConnectionBudget, error) {
	b := ConnectionBudget{Pools: poolConns}
	ownOpen := int(pool.Stat().TotalConns())
	err := pool.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
			current_setting('superuser_reserved_connections')::int + coalesce(current_setting('reserved_connections', true)::int, 0),
			(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int`).
		Scan(&b.MaxConnections, &b.Reserved, &b.Others)
	if err != nil {
		return b, fmt.Errorf("read max_connections: %w", err)
	}
	// The query's own connection is one of the pool's, counted in
	// pg_stat_activity; the stat may lag by the one it just opened.
	b.Others = max(0, b.Others-max(ownOpen, 1))
	return b, nil
}

// WarnConnectionBudget logs a warning when pools that may open poolConns
// connections in all cannot fit in the server's max_connections. It never
// fails the start: a server we cannot ask is reported by the first query.
func WarnConnectionBudget(ctx context.Context, pool *pgxpool.Pool, poolConns int, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	b, err := ReadConnectionBudget(ctx, pool, poolConns)
	if err != nil {
		logger.Warn("connection budget: cannot read max_connections", "err", err)
		return
	}
	if p := b.Problem(); p != "" {
		logger.Warn("connection budget: "+p, "pools_max_conns", b.Pools, "max_connections", b.MaxConnections,
			"reserved_connections", b.Reserved, "other_connections", b.Others)
	}
}
