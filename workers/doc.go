// Package workers holds the River workers of `overage work` and wires them
// into a River client: the report worker that sends overage to Stripe, the
// periodic sweep that requeues unbilled logs, and maintenance jobs such as
// the expiry of idempotency records.
package workers
