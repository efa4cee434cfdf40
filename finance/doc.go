// Package finance is the billed-status view of the pipeline: per tenant and
// in total, how many usage logs are billed, pending, not billable, under
// review or failed, how much overage they carry and how much of it Stripe
// has accepted. It serves `GET /v1/billing/status` (Handler, bearer
// ADMIN_TOKEN) and backs `overage status` (Status, WriteTable, and
// json.Marshal of a Statement for --json).
//
// The design behind it is in docs/finance.md.
package finance
