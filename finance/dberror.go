package finance

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage"
)

// retryAfterUnavailable is the Retry-After of a 503: the database is
// usually back within seconds (a failover, a restart).
const retryAfterUnavailable = 5 * time.Second

// dbError turns a database failure into an application error: an
// unreachable or overloaded database is EUNAVAILABLE (503, retry later),
// anything else stays internal (500, cause logged, never shown).
//
// The classification is ingest's (isUnavailable in ingest/service.go),
// copied: it belongs in one internal package both import.
func dbError(err error) error {
	if err == nil {
		return nil
	}
	var appErr *overage.Error
	if errors.As(err, &appErr) || !isUnavailable(err) {
		return err
	}
	return &unavailableError{cause: err}
}

// isUnavailable reports whether err says the database could not be reached
// or could not serve, rather than that a statement was wrong.
func isUnavailable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "53", "57": // connection exception, insufficient resources, operator intervention
			return true
		}
		return false
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connErr) || errors.As(err, &netErr) ||
		pgconn.Timeout(err) || pgconn.SafeToRetry(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded)
}

// unavailableError is EUNAVAILABLE with its cause kept for the log.
type unavailableError struct{ cause error }

func (e *unavailableError) Error() string { return "database unavailable: " + e.cause.Error() }
func (e *unavailableError) Unwrap() []error {
	return []error{e.cause, &overage.Error{
		Code: overage.EUNAVAILABLE, Type: "service-unavailable",
		Message: "the billing database is unreachable; retry later", RetryAfter: retryAfterUnavailable,
	}}
}
