package overage

import (
	"errors"
	"fmt"
	"time"
)

// ErrorCode classifies application errors. The HTTP layer maps each code to
// a status in exactly one table (internal/httpx); nothing else decides
// statuses.
type ErrorCode string

const (
	EMALFORMED    ErrorCode = "malformed"    // the request cannot be parsed
	EINVALID      ErrorCode = "invalid"      // parsed, but a field breaks a rule
	EUNAUTHORIZED ErrorCode = "unauthorized" // no valid credential
	EFORBIDDEN    ErrorCode = "forbidden"    // valid credential, not allowed
	ENOTFOUND     ErrorCode = "not_found"    // nothing the caller may see
	EMETHOD       ErrorCode = "method"       // the path does not serve this method
	ECONFLICT     ErrorCode = "conflict"     // the request collides with another
	ETOOLARGE     ErrorCode = "too_large"    // body over the limit
	EBUSY         ErrorCode = "busy"         // the caller has too much in flight; retry later
	EUNAVAILABLE  ErrorCode = "unavailable"  // a dependency is down; retry later
	EINTERNAL     ErrorCode = "internal"     // a bug or an unexpected failure
)

// Error is an error a user can act on: every field is safe to show.
type Error struct {
	Code ErrorCode
	// Type is the stable slug of the problem type (RFC 9457), e.g.
	// "idempotency-key-reused"; clients branch on it, never on Message.
	Type    string
	Message string
	// Fields names each offending input, all at once.
	Fields []FieldError
	// RetryAfter, when set, tells the client when a retry may succeed.
	RetryAfter time.Duration
}

// FieldError names one bad input and what is wrong with it.
type FieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s (%s): %s", e.Type, e.Code, e.Message)
}

// Errorf returns an *Error with the given code, type and formatted message.
func Errorf(code ErrorCode, typ, format string, args ...any) *Error {
	return &Error{Code: code, Type: typ, Message: fmt.Sprintf(format, args...)}
}

// NotFound is the error of anything the caller may not see — an unknown
// id, another tenant's, an unknown path: one problem type, not-found, for
// all of them.
func NotFound(format string, args ...any) *Error {
	return Errorf(ENOTFOUND, "not-found", format, args...)
}

// Invalid is the error of input whose fields failed validation: one problem
// type for every validator, naming each bad field.
func Invalid(fields []FieldError, format string, args ...any) *Error {
	e := Errorf(EINVALID, "validation-failed", format, args...)
	e.Fields = fields
	return e
}

// AsError returns the application error in err's chain, or an internal one
// that reveals nothing of err: internal details are logged, never shown.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: EINTERNAL, Type: "internal", Message: "internal error"}
}
