// Package review is the operator's review of usage logs that must not be
// sent to Stripe automatically: those in needs_review (their first send is
// older than Stripe's idempotency window allows for a safe automatic
// resend) and those that failed (Stripe refused them with an error a retry
// cannot fix). It backs `overage review list` (List, WriteTable, and
// json.Marshal of the items for --json) and `overage review resolve ID
// --as billed|resend|void --reason TEXT [--by NAME] [--force]` (Resolver).
//
// The design behind it is in docs/review.md.
package review
