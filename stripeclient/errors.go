package stripeclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	stripe "github.com/stripe/stripe-go/v79"
)

// Kind says what the caller should do about an Error.
type Kind int

const (
	// KindRetryable: the same request, with the same key, may succeed later
	// (network error, 5xx, 409, 429, a deadline, or we never sent it).
	KindRetryable Kind = iota + 1
	// KindPermanent: sending the same request again will not succeed
	// (invalid request, missing customer, Stripe-Should-Retry: false, or we
	// refused to send it).
	KindPermanent
)

func (k Kind) String() string {
	switch k {
	case KindRetryable:
		return "retryable"
	case KindPermanent:
		return "permanent"
	default:
		return "unknown"
	}
}

// alreadyExistsPrefix is how Stripe starts its message for a meter event
// whose identifier it already holds.
const alreadyExistsPrefix = "An event already exists with identifier"

// Error is every error SendMeterEvent returns. Use errors.As to get at it,
// or IsRetryable / IsPermanent.
type Error struct {
	Kind       Kind
	HTTPStatus int    // 0 when no HTTP response was received
	Code       string // Stripe's error code, e.g. "rate_limit"
	Type       string // Stripe's error type, e.g. "invalid_request_error"
	Message    string // Stripe's message, or ours when no response came back
	RequestID  string // Stripe's Request-Id, for support
	RetryAfter time.Duration
	Err        error // the underlying error (a *stripe.Error, a net error, ...)
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "stripe %s error", e.Kind)
	if e.HTTPStatus != 0 {
		fmt.Fprintf(&b, " (status %d", e.HTTPStatus)
		if e.Type != "" {
			fmt.Fprintf(&b, ", type %s", e.Type)
		}
		if e.Code != "" {
			fmt.Fprintf(&b, ", code %s", e.Code)
		}
		if e.RequestID != "" {
			fmt.Fprintf(&b, ", request %s", e.RequestID)
		}
		b.WriteString(")")
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	// A *stripe.Error's own text is a JSON dump of what we already printed.
	var se *stripe.Error
	if e.Err != nil && !errors.As(e.Err, &se) {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// IsRetryable reports whether err is (or wraps) an Error of KindRetryable.
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == KindRetryable
}

// IsBusy reports whether err is the refusal of a call that would have
// queued behind too many others for the same customer's meter. Nothing was
// sent; the caller should try again later instead of waiting.
func IsBusy(err error) bool {
	return errors.Is(err, errBusy)
}

// IsPermanent reports whether err is (or wraps) an Error of KindPermanent.
func IsPermanent(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == KindPermanent
}

// observation is what our transport saw of the last HTTP response of one
// call. stripe-go turns a response with a non-JSON body (a proxy's 502 page,
// a 404 from a wrong base URL) into a plain error without its status; the
// observation keeps status and headers so classification never has to guess.
type observation struct {
	status int
	header http.Header
}

// mapOutcome is the one place where the result of a meter event call is
// classified. key is our idempotency key and identifier; resp is stripe-go's
// response on success; obs is what the transport saw, if anything.
func mapOutcome(key string, resp *stripe.APIResponse, callErr error, obs *observation) (Result, error) {
	if callErr == nil {
		var res Result
		if resp != nil {
			res.RequestID = resp.RequestID
			res.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
		}
		return res, nil
	}

	out := &Error{Err: callErr}
	var header http.Header
	if obs != nil && obs.status != 0 {
		out.HTTPStatus = obs.status
		header = obs.header
	}

	var se *stripe.Error
	if errors.As(callErr, &se) {
		out.HTTPStatus = se.HTTPStatusCode
		out.Code = string(se.Code)
		out.Type = string(se.Type)
		out.Message = se.Msg
		out.RequestID = se.RequestID
		if se.LastResponse != nil && se.LastResponse.Header != nil {
			header = se.LastResponse.Header
		}
	}

	if out.HTTPStatus == 0 {
		// No response at all: connection refused or reset, a lost response,
		// a client timeout or the caller's deadline. Stripe may or may not
		// have applied the event; resending with the same key settles it.
		out.Kind = KindRetryable
		out.Message = "no response from Stripe"
		if errors.Is(callErr, context.DeadlineExceeded) || errors.Is(callErr, context.Canceled) {
			out.Message = "no response from Stripe before the context ended"
		}
		return Result{}, out
	}

	if out.HTTPStatus < 400 {
		// A success status whose body stripe-go could not read: Stripe may
		// have applied the event, and resending with the same key replays
		// the answer, so this is worth another try, never a failure.
		out.Kind = KindRetryable
		out.Message = fmt.Sprintf("unreadable %d response from Stripe", out.HTTPStatus)
		if header != nil {
			out.RequestID = header.Get("Request-Id")
		}
		return Result{}, out
	}

	if header != nil {
		if out.RequestID == "" {
			out.RequestID = header.Get("Request-Id")
		}
		out.RetryAfter = parseRetryAfter(header.Get("Retry-After"))
	}
	if out.Message == "" {
		out.Message = http.StatusText(out.HTTPStatus)
	}

	// Checked before Stripe-Should-Retry, which Stripe sets to false on this
	// answer: for our own derived identifier it means an earlier send landed.
	if out.HTTPStatus == http.StatusBadRequest &&
		strings.HasPrefix(out.Message, alreadyExistsPrefix) &&
		mentionsIdentifier(out.Message, key) {
		return Result{AlreadyApplied: true, RequestID: out.RequestID}, nil
	}

	switch {
	case header != nil && header.Get("Stripe-Should-Retry") == "false":
		out.Kind = KindPermanent
	case header != nil && header.Get("Stripe-Should-Retry") == "true":
		out.Kind = KindRetryable
	case out.HTTPStatus == http.StatusConflict,
		out.HTTPStatus == http.StatusTooManyRequests,
		out.HTTPStatus >= 500:
		out.Kind = KindRetryable
	default:
		out.Kind = KindPermanent
	}
	return Result{}, out
}

// mentionsIdentifier reports whether Stripe's message names exactly our
// identifier, whatever quoting Stripe puts around it. A message about some
// other identifier must not be taken as proof that ours was applied.
func mentionsIdentifier(msg, key string) bool {
	rest := strings.TrimPrefix(msg, alreadyExistsPrefix)
	for i := 0; ; {
		j := strings.Index(rest[i:], key)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(key)
		if (start == 0 || !isIdentByte(rest[start-1])) && (end == len(rest) || !isIdentByte(rest[end])) {
			return true
		}
		i = start + 1
	}
}

func isIdentByte(c byte) bool {
	return c == '-' || c == '_' || c == ':' ||
		(c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func parseRetryAfter(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil && secs > 0 {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}

// localError is an Error for something decided before or instead of a call
// to Stripe; nothing was sent.
func localError(kind Kind, msg string, err error) *Error {
	return &Error{Kind: kind, Message: msg, Err: err}
}
