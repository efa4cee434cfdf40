package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Default pool sizes. Together they stay under PostgreSQL's default
// max_connections (100, 3 reserved): `work` needs more, because each of its
// report jobs commits twice while `serve` commits once per request.
const (
	ServeMaxConns = 32
	WorkMaxConns  = 60
	ToolMaxConns  = 4
)

// OpenPool connects to PostgreSQL with at most maxConns connections. Sizes
// and timeouts given in the URL (pool_max_conns, connect_timeout) win.
func OpenPool(ctx context.Context, databaseURL string, maxConns int32) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", RedactParseError(err))
	}
	if !strings.Contains(databaseURL, "pool_max_conns") {
		pc.MaxConns = maxConns
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
