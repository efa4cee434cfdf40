package usagelog

import (
	"fmt"

	"github.com/overage-billing/overage"
)

// The statements ingest reads usage logs with: ingest scans them into
// overage.UsageLog and answers with them; like every statement on
// usage_logs, they live here (docs/architecture.md).

// RequestIDIs is the condition that the log l has the request_id x (an
// SQL expression): the request_id itself and its digest. A partition made
// since migration 0061 indexes (tenant_id, RequestDigestSQL) only; one
// made before and holding logs then keeps its index on (tenant_id,
// request_id) until it is dropped. Stating both, each partition's probe is
// an index probe on the whole key of whichever index it has, and a log
// whose request_id only shares the digest of x never answers for x.
func RequestIDIs(l, x string) string {
	return fmt.Sprintf(`%[1]s.request_id = %[2]s AND md5(%[1]s.request_id)::uuid = md5(%[2]s)::uuid`, l, x)
}

// RequestDigestSQL is the expression of the partitions' unique index on
// request_id (since 0061): the MD5 of the request_id, 16 bytes as a uuid,
// whatever the request_id's length.
const RequestDigestSQL = `md5(request_id)::uuid`

// LogsByRequestIDSQL reads the tenant's logs recorded under the
// request_ids in $2: one index probe a request_id in each partition kept,
// as long as it is kept (LIMIT 1 stops at the first found). Old
// partitions receive no new log (ids are minted at ingest), so reading
// them is enough there; across the current bound the claims referee
// (ClaimRequestIDsSQL).
var LogsByRequestIDSQL = `SELECT ` + LogColumns + `
	FROM unnest($2::text[]) AS r (rid)
	CROSS JOIN LATERAL (
		SELECT * FROM usage_logs l WHERE l.tenant_id = $1 AND ` + RequestIDIs("l", "r.rid") + ` LIMIT 1) AS u`

// ReplayHorizon is how long before now (by the database's clock) the
// original of an event ingest accepts can have been recorded: an event is
// refused when its timestamp is older than overage.MaxEventAge (35 days)
// or more than overage.MaxFutureSkew (5 minutes) in the future, so a
// replay's original, carrying the same timestamp, was recorded no earlier
// than the replay's timestamp minus 5 minutes, itself no earlier than 35
// days ago; ClaimWindow (an hour) more covers the app servers' clocks,
// which mint the ids and judge the age, being off the database's. The
// lookups by request_id no longer stop there (a request_id is
// deduplicated for as long as its log is kept); what is left of it
// bounds the claims' reasoning and the tests.
const ReplayHorizon = overage.MaxEventAge + overage.MaxFutureSkew + ClaimWindow

// MeterTokensSQL reads a log's meter_tokens: NULL when they equal its
// meter_overage (InsertSQL stores them so), the array otherwise.
const MeterTokensSQL = `coalesce(meter_tokens, meter_overage)`

const LogColumns = `id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
	cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens,
	overage_input_tokens, overage_output_tokens, billing_status, billed_at, created_at,
	first_attempt_at, billing_message, input_accepted_at, output_accepted_at, input_report_lead, output_report_lead,
	corrects, correction_reason, meter_keys, ` + MeterTokensSQL + `, meter_overage, meter_leads, meter_accepted_at, corrected_by,
	coalesce(stripe_timestamp, 'usage')`

// GetLogSQL reads the log $1.
const GetLogSQL = `SELECT ` + LogColumns + ` FROM usage_logs WHERE id = $1`

// CorrectionsOfSQL reads the corrections of the log $1, oldest first.
const CorrectionsOfSQL = `SELECT ` + LogColumns + ` FROM usage_logs WHERE corrects = $1 ORDER BY id`

// ByRequestIDSQL is a page of the logs of tenant $1 under request_id $2
// (a stream's, or the one recorded under it) after id $3, at most $4.
// The request_id arm states the digest too (RequestIDIs).
var ByRequestIDSQL = `SELECT ` + LogColumns + ` FROM usage_logs
		WHERE tenant_id = $1 AND (stream_request_id = $2 OR (` + RequestIDIs("usage_logs", "$2") + `)) AND ($3::uuid IS NULL OR id > $3)
		ORDER BY id LIMIT $4`

// LogsByIDSQL reads the logs of the ids $1: one probe an id, of its
// partition only whatever the plan. A generic plan cannot prune on
// id = ANY($1); here each id is a parameter of the nested loop (LIMIT 1
// keeps the subquery from being flattened into a join the planner may
// hash), which prunes each probe to its partition.
const LogsByIDSQL = `SELECT ` + LogColumns + ` FROM unnest($1::uuid[]) AS k (kid)
	CROSS JOIN LATERAL (SELECT * FROM usage_logs l WHERE l.id = k.kid LIMIT 1) AS u`

// LockLogSQL reads and locks the log $1: the referee of two corrections
// of one log.
const LockLogSQL = `SELECT ` + LogColumns + ` FROM usage_logs WHERE id = $1 FOR UPDATE`

// TenantOfLogSQL reads the tenant of the log $1.
const TenantOfLogSQL = `SELECT tenant_id FROM usage_logs WHERE id = $1`

// PlainLogByRequestIDSQL reads the log a plain event of the tenant $1
// recorded under the request_id $2 (not a stream's), in every partition
// kept, as LogsByRequestIDSQL.
var PlainLogByRequestIDSQL = `SELECT ` + LogColumns + ` FROM usage_logs u
	WHERE u.tenant_id = $1 AND ` + RequestIDIs("u", "$2") + ` AND u.stream_request_id IS NULL`

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
