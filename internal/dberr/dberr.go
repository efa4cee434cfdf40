// Package dberr classifies database failures for the HTTP layer: an
// unreachable or overloaded PostgreSQL is EUNAVAILABLE (503, retry later,
// nothing was stored), a total out of bigint's range is EINVALID (422,
// nothing was stored), anything else stays what it was (an application
// error, or internal: 500 with the cause logged and never shown).
package dberr

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage"
)

// RetryAfter is the Retry-After of a 503: the database is usually back
// within seconds (a failover, a restart).
const RetryAfter = 5 * time.Second

// Classify returns err, marked EUNAVAILABLE when it says the database could
// not be reached or could not serve; message is what the client reads.
func Classify(err error, message string) error {
	if err == nil {
		return nil
	}
	var appErr *overage.Error
	if errors.As(err, &appErr) {
		return err
	}
	if IsOverflow(err) {
		return &overflowError{cause: err}
	}
	if !IsUnavailable(err) {
		return err
	}
	return &unavailableError{cause: err, message: message}
}

// numericValueOutOfRange is the SQLSTATE of a bigint sum or addition past
// 2^63-1.
const numericValueOutOfRange = "22003"

// IsOverflow reports whether PostgreSQL refused a number out of its
// type's range: a running total (a billing period's tokens) that would
// pass 2^63-1.
func IsOverflow(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == numericValueOutOfRange
}

// overflowError is an EINVALID answer (422) to a write whose tokens would
// take a total past what it can hold: the statement rolled back, nothing
// was recorded, and the same request can never succeed.
type overflowError struct{ cause error }

func (e *overflowError) Error() string { return "total out of range: " + e.cause.Error() }
func (e *overflowError) Unwrap() []error {
	const detail = "would take its billing period's total past 9223372036854775807 tokens"
	return []error{e.cause, overage.Invalid([]overage.FieldError{
		{Field: "input_tokens", Detail: detail + ""},
		{Field: "output_tokens", Detail: detail + ""},
	}, "the tokens would overflow their billing period's total; nothing was recorded")}
}

// IsUnavailable reports whether err says the database could not be reached
// or could not serve, rather than that a statement was wrong.
func IsUnavailable(err error) bool {
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

// IsDataException reports whether PostgreSQL refused a value it cannot
// hold (SQLSTATE class 22: a NUL in text or jsonb, a lone surrogate, a
// number or time out of range): the input is at fault, not the database.
func IsDataException(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code[:2] == "22"
}

// unavailableError is EUNAVAILABLE with its cause kept for the log.
type unavailableError struct {
	cause   error
	message string
}

func (e *unavailableError) Error() string { return "database unavailable: " + e.cause.Error() }
func (e *unavailableError) Unwrap() []error {
	return []error{e.cause, &overage.Error{
		Code: overage.EUNAVAILABLE, Type: "service-unavailable", Message: e.message, RetryAfter: RetryAfter,
	}}
}
