// Package stripeclient is the project's only seam over stripe-go for sending
// usage to Stripe as Billing Meter Events.
//
// It owns four promises that the rest of the pipeline relies on for
// exactly-once billing:
//
//  1. Every meter event is sent with OUR key. MeterEvent.Key is used as both
//     the Idempotency-Key header and the meter event identifier. stripe-go
//     invents a random idempotency key for any write without one, which
//     would turn a retry into a second charge, so SendMeterEvent refuses an
//     event without a key (a permanent error, nothing sent). There is no
//     other exported way to send.
//
//  2. Every outcome is classified once, in one place (mapOutcome): a *Error
//     whose Kind is KindRetryable (network errors, 5xx, 409, 429, the HTTP
//     call's context deadline) or KindPermanent (other 4xx, or
//     Stripe-Should-Retry: false). Stripe's "An event already exists with
//     identifier <our key>" is not an error: the earlier send was applied, so
//     the result is Result{AlreadyApplied: true}. Stripe's message and
//     request id are kept for the operator.
//
//  3. Stripe's live-mode limits are respected from one process: no two
//     concurrent calls for one (customer, event name) — a keyed lock held for
//     the duration of the call — and a client-side token-bucket rate limit
//     (default 1,000 calls/s). Both waits honour the caller's context.
//
//  4. The secret key is never logged or printed: not by this package, not by
//     stripe-go's logger (adapted to slog and scrubbed), not by fmt on Config
//     or Client, and not in error strings.
//
// Retries belong to the caller (River's backoff). stripe-go's own network
// retries are off by default and capped at one, because its sleep between
// retries ignores the context and holds the per-customer lock. Note that
// net/http itself may transparently resend a request whose response was lost
// on a reused keep-alive connection, because the request carries an
// Idempotency-Key; that is safe precisely because the key is always ours.
//
// No stripe-go globals are used or modified: the backend is built with
// stripe.GetBackendWithConfig and a billing/meterevent client bound to it.
package stripeclient
