// Package review is the operator's review of usage logs that must not be
// sent to Stripe automatically: those in needs_review (their first send is
// older than Stripe's idempotency window allows for a safe automatic
// resend) and those that failed (Stripe refused them with an error a retry
// cannot fix). It backs `overage review list` (List, WriteTable, and
// json.Marshal of the items for --json) and `overage review resolve ID
// --as billed|resend|void --reason TEXT [--by NAME] [--force]` (Resolver).
//
// What it owns: the review_actions table (migrations/0004_review.sql), the
// append-only audit trail of every decision, and the only code path that
// takes a log out of needs_review or failed (the transition itself is
// usagelog.Store.ResolveTx).
//
// A log is billed through reports: one Stripe meter event per dimension
// for many logs (package usagelog). A decision on a log is therefore a
// decision on its reports under review or failed, and on every member of
// them: each member changes with the log and gets its own audit row
// (Resolution.Members counts them). Resolving one log of a 1,000-log report
// resolves the 1,000.
//
// What it promises:
//
//   - Every decision is audited, atomically. Resolve locks the log
//     (SELECT ... FOR UPDATE), checks it is still under review, writes one
//     review_actions row (who, why, when by the database clock, the status,
//     message and first attempt time it replaced, whether it was forced),
//     changes the log and, for a resend, queues its report job — all in
//     one transaction, so there is never a decision without its record nor
//     a record without its effect. Two operators resolving one log at once
//     are serialised by the row lock: the second finds it resolved and is
//     refused ("not-reviewable"); so is any log not in needs_review or
//     failed (pending, billed, not_billable).
//   - billed: the operator has confirmed that Stripe holds the usage (for
//     example in the Dashboard's meter events). The log becomes billed,
//     billed_at now; nothing is sent. The *_accepted_at columns are left as
//     they were: they record what Stripe told us, not what an operator did.
//   - void: the log is never billed. It becomes not_billable — the
//     contract's status set (pending, billed, not_billable, needs_review,
//     failed) has no "void", and adding one would change the API, the
//     finance counters and the usage_logs check constraint for a status
//     that means the same as not_billable: never sent. What tells a voided
//     log from one without overage is its billing_message ("voided by …")
//     and its review_actions row. Voiding does not take back what Stripe
//     already accepted; the message says so when a dimension was.
//   - resend is the only path by which such a log is sent again, and it
//     cannot bill twice inside Stripe's window. It sends under the same
//     keys, usage-log:<lead>:<dimension> of its reports, with the same
//     members and values, so while Stripe (or the emulator)
//     may still hold them — the first attempt is younger than
//     IdempotencyWindow (STRIPE_IDEMPOTENCY_WINDOW), by the database clock
//     — Stripe would answer from the earlier attempt (a replay, or "an
//     event already exists") rather than send anything: the resend is
//     refused ("resend-inside-window", saying until when) unless Force.
//     A forced resend inside the window is still deduplicated by Stripe
//     under the same key: if the earlier attempt was applied, the replay
//     counts as accepted and the log becomes billed, applied once. A resend
//     opens the log's reports again with a new first attempt (now, so the
//     window guard starts afresh) and sets their members pending; a log in
//     no report gets first_attempt_at cleared and joins one when its job
//     runs. Reports Stripe already accepted stay accepted, so a dimension
//     Stripe holds is never sent again. The tenant's report job is queued
//     in the same transaction (unique per batch period: a queued one is
//     reused); a job running meanwhile is no obstacle, since each report is
//     sent under a lease.
//
// What a resend after the window means: Stripe has forgotten the keys, so
// if the earlier attempt was in fact applied, the resend bills it a second
// time. Choosing resend there is the operator's statement that Stripe does
// not hold the usage (checked in Stripe); choosing billed is the statement
// that it does. The audit row records which, and who said so.
//
// What Force still risks: a forced resend starts a new window for the
// worker, but Stripe forgets the old keys on the old schedule. If the
// forced resend keeps failing until the old window has passed and the
// earlier attempt had been applied, a later retry is applied again. Force
// is for an operator who knows what Stripe holds.
//
// Every time comparison uses the database clock (now()), as the worker and
// the sweep do.
package review
