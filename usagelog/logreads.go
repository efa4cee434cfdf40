package usagelog

// The statements ingest reads usage logs with: ingest scans them into
// overage.UsageLog and answers with them; like every statement on
// usage_logs, they live here (docs/architecture.md).

// LogsByRequestIDSQL reads the tenant's logs recorded under the
// request_ids in $2: one index probe a request_id, as idempotency.LookupSQL.
var LogsByRequestIDSQL = `SELECT ` + LogColumns + `
	FROM unnest($2::text[]) AS r (rid)
	CROSS JOIN LATERAL (
		SELECT * FROM usage_logs l WHERE l.tenant_id = $1 AND l.request_id = r.rid LIMIT 1) AS u`

const LogColumns = `id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
	cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens,
	overage_input_tokens, overage_output_tokens, billing_status, billed_at, created_at,
	first_attempt_at, billing_message, input_accepted_at, output_accepted_at, input_report_lead, output_report_lead,
	corrects, correction_reason, meter_keys, meter_tokens, meter_overage, meter_leads, meter_accepted_at, corrected_by,
	coalesce(stripe_timestamp, 'usage')`

// GetLogSQL reads the log $1.
const GetLogSQL = `SELECT ` + LogColumns + ` FROM usage_logs WHERE id = $1`

// CorrectionsOfSQL reads the corrections of the log $1, oldest first.
const CorrectionsOfSQL = `SELECT ` + LogColumns + ` FROM usage_logs WHERE corrects = $1 ORDER BY id`

// ByRequestIDSQL is a page of the logs of tenant $1 under request_id $2
// (a stream's, or the one recorded under it) after id $3, at most $4.
const ByRequestIDSQL = `SELECT ` + LogColumns + ` FROM usage_logs
		WHERE tenant_id = $1 AND (stream_request_id = $2 OR request_id = $2) AND ($3::uuid IS NULL OR id > $3)
		ORDER BY id LIMIT $4`

// LogsByIDSQL reads the logs of the ids $1.
const LogsByIDSQL = `SELECT ` + LogColumns + ` FROM usage_logs WHERE id = ANY($1)`

// LockLogSQL reads and locks the log $1: the referee of two corrections
// of one log.
const LockLogSQL = `SELECT ` + LogColumns + ` FROM usage_logs WHERE id = $1 FOR UPDATE`

// TenantOfLogSQL reads the tenant of the log $1.
const TenantOfLogSQL = `SELECT tenant_id FROM usage_logs WHERE id = $1`

// PlainLogByRequestIDSQL reads the log a plain event of the tenant $1
// recorded under the request_id $2 (not a stream's).
const PlainLogByRequestIDSQL = `SELECT ` + LogColumns + ` FROM usage_logs
	WHERE tenant_id = $1 AND request_id = $2 AND stream_request_id IS NULL`

// StreamLogsSQL reads the logs of the stream $2 of the tenant $1: its
// increases and the corrections its final checkpoints made.
const StreamLogsSQL = `SELECT ` + LogColumns + ` FROM usage_logs WHERE tenant_id = $1 AND stream_request_id = $2`

// CorrectedPeriodSQL reads, for the correction of the log $2 of the tenant
// $1, the log's allowance period, the period of now, whether the log's
// period is closed ($3 being PERIOD_CLOSE_GRACE in seconds:
// PeriodClosedSQL, the one rule) and now().
var CorrectedPeriodSQL = `SELECT u.period_start, ` + PeriodOfSQL("$1", "now()") + `,
		` + PeriodClosedSQL("$1", "u.period_start", "$3") + `,
		now()
	FROM usage_logs u WHERE u.id = $2`

// ClosedSinceSQL reads whether the log $1, recorded while its period was
// open and not yet in a report (stripe_timestamp NULL), is in a period
// closed now ($2 being PERIOD_CLOSE_GRACE in seconds).
var ClosedSinceSQL = `SELECT u.stripe_timestamp IS NULL AND ` + PeriodClosedSQL("u.tenant_id", "u.period_start", "$2") + `
	FROM usage_logs u WHERE u.id = $1`
