// Package finance is the billed-status view of the pipeline: per tenant and
// in total, how many usage logs are billed, pending, not billable, under
// review or failed, how much overage they carry and how much of it Stripe
// has accepted. It serves `GET /v1/billing/status` (Handler, bearer
// ADMIN_TOKEN) and backs `overage status` (Status, WriteTable, and
// json.Marshal of a Report for --json).
//
// What it owns: the billing_counters table and the triggers on usage_logs
// that maintain it (migrations/0002_finance.sql), the partial index
// usage_logs_tenant_pending (migrations/0003_finance_pending_index.sql), and
// RebuildCounters.
//
// What it promises:
//
//   - Exact numbers. The counters change in the same transaction as the
//     usage log, through triggers that fire on every statement that
//     writes logs (ingest, report worker, sweep, an operator's SQL, DELETE,
//     TRUNCATE, COPY) and add up the statement's rows (transition tables,
//     migration 0020), so a Report equals a GROUP BY over usage_logs at the
//     snapshot it was read in. One Report is read in one statement, hence
//     one snapshot: its totals are the sums of its tenants.
//   - Fast at any size. A Report reads the counter rows (at most five per
//     tenant) and, per tenant, the first entry of the partial index on
//     pending logs; it never scans usage_logs. bench/status measures it on
//     10 million logs.
//   - No deadlock from the counters on today's paths: the triggers upsert
//     deltas, once per counter row and statement, all of one slot and in
//     (tenant, status) order; migrations 0007 and 0020 give the lock order
//     per path. Counter work grows with the rows a statement changes, not
//     with their square (it did with per-row triggers: one 10,000-log
//     report cost seconds).
//   - The finance API fails closed: without ADMIN_TOKEN configured it
//     refuses everyone (401); the token is compared in constant time; an
//     unreachable database is a 503 with Retry-After.
//
// Definitions. usage_logs counts every log of the tenant; billed, pending,
// not_billable, needs_review and failed count logs by billing_status.
// overage_*_tokens sum the overage of every log, whatever its status;
// billed_*_tokens sum the overage of billed logs only (what Stripe
// accepted). oldest_pending_at is the created_at of the oldest pending log
// (null when none); in the totals it is the minimum over the tenants.
//
// Operators: RebuildCounters recomputes the counters from usage_logs. Use
// it after writing usage_logs with the triggers disabled (a bulk load, as
// bench/status does), or if the counters are ever suspected wrong; it
// blocks writes to usage_logs for the duration of one scan of the table
// (seconds per few million logs) and never blocks readers.
package finance
