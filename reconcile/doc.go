// Package reconcile compares what PostgreSQL holds as billed with what
// Stripe reports having received, per customer, meter and UTC day — the
// check behind `overage reconcile --from DAY --to DAY [--tenant ID]`.
//
// # The two sides
//
// Database: for every usage log with billing_status 'billed', its overage
// per dimension (overage_input_tokens for the input meter,
// overage_output_tokens for the output meter), summed per (the tenant's
// stripe_customer_id, dimension, UTC day of usage_logs.ts). A billed log
// has had every dimension with overage accepted by Stripe, so billed is the
// durable record of what Stripe should hold. Logs that are pending,
// not_billable, needs_review or failed are not billed and are not counted.
//
// Stripe: for every customer in scope and each of the two meter event
// names, the meter's event summaries over the range with
// value_grouping_window=day (billing/metereventsummary in stripe-go), read
// through a stripeclient.SummaryReader. Meters are found by event name in
// the account's meters list; when several meters (an active one and
// deactivated predecessors) carry the event name, their summaries are
// added, since each counted the events it received while active. A meter
// event's timestamp is the usage's timestamp in whole seconds, so an event
// lands in the same UTC day on both sides.
//
// Every (customer, meter, day) with a non-zero value on either side is one
// Row; a value missing on one side is 0 there.
//
// # What a difference means
//
//   - Database > Stripe: a log is billed in the database but (some of) its
//     meter event was never applied at Stripe — lost revenue, and a broken
//     exactly-once promise worth an incident.
//   - Stripe > Database: Stripe applied an event for a log the database does
//     not count as billed — for example a needs_review log whose earlier send
//     Stripe did take, a failed log one of whose dimensions was accepted
//     before the other was refused, or an event sent to the meter by
//     something other than this pipeline. The customer is (or will be)
//     charged for it.
//
// # Eventual consistency: too recent to judge
//
// Stripe aggregates meter events asynchronously, and the pipeline itself
// may be mid-flight: a log being sent, retried with backoff (minutes), or
// waiting for the sweep (SWEEP_INTERVAL + SWEEP_GRACE, 20 minutes by
// default). So a window is not judged until it has settled for
// Params.SettleAfter (default DefaultSettleAfter, 2 h: well past the
// worker's retry schedule, the sweep's grace and Stripe's aggregation
// delay). With cutoff = now − SettleAfter, a row is too_recent — reported
// with both numbers, never counted as a difference — when
//
//   - its day ends after the cutoff (today is never judged; yesterday is
//     judged from 02:00 UTC with the default), or
//   - the database shows billing activity for that customer and day after
//     the cutoff: a log first attempted, accepted or billed since then. Usage
//     may arrive up to 35 days late, so an old day can be in flight too.
//
// # Days and scope
//
// Days are UTC, which is also the alignment Stripe demands of day-grouped
// summaries. Params.From and Params.To are both inclusive days
// (`--from 2026-11-01 --to 2026-11-30` is November); times are truncated to
// their UTC day. With Params.TenantID the scope is that tenant's Stripe
// customer; if several tenants share that customer they are all in scope,
// because Stripe's summaries cannot tell them apart.
//
// The database side scans usage_logs by ts; without a tenant filter that is
// a scan of the table, which is fine for an operator's command but not for a
// hot path.
package reconcile
