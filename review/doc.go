// Package review is the operator's review of usage logs that must not be
// sent to Stripe automatically: those in needs_review (their first send is
// older than Stripe's idempotency window allows for a safe automatic
// resend) and those that failed (Stripe refused them with an error a retry
// cannot fix). It backs `overage review list` (List, WriteTable, and
// json.Marshal of the items for --json) and `overage review resolve ID
// --as billed|resend|void --reason TEXT [--by NAME] [--force]` (Resolver).
//
// A log is billed through reports (package usagelog), so a decision on a
// log is a decision on its reports under review or failed and on every
// member of them, each audited: resolving one log of a 1,000-log report
// resolves the 1,000. A resend reuses each report's key
// (usage-log:<lead>:<dimension>), members and value.
//
// The design behind it is in docs/review.md.
package review
