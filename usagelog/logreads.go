package usagelog

import (
	"fmt"

	"github.com/overage-billing/overage"
)

// The statements ingest reads usage logs with: ingest scans them into
// overage.UsageLog and answers with them; like every statement on
// usage_logs, they live here (docs/architecture.md).

// RequestIDIs is the condition that the log l is the tenant's (an SQL
// expression) and has the request_id x, in the terms of every unique index
// a partition can have: the digest of tenant and request_id
// (RequestKey, since migration 0067), the request_id's digest beside the
// tenant (RequestDigestSQL, from 0061), and the request_id itself (before
// 0061). A partition made in one era and holding logs keeps its index
// until it is dropped; stating all three, each partition's probe is an
// index probe on the whole key of whichever index it has (as
// idempotency's keyConditions does for the idempotency keys). The tenant
// and the request_id themselves are compared too, so a log whose request_id
// only shares a digest of x never answers for x.
func RequestIDIs(l, tenant, x string) string {
	return requestIDMatches(l, tenant, x, RequestKey(tenant+"::uuid", x))
}

// requestIDMatches is RequestIDIs with the digest of tenant and x
// (RequestKeySQL's) given as the expression key.
func requestIDMatches(l, tenant, x, key string) string {
	return fmt.Sprintf(`%[1]s.tenant_id = %[2]s AND %[4]s = %[5]s AND md5(%[1]s.request_id)::uuid = md5(%[3]s)::uuid AND %[1]s.request_id = %[3]s`,
		l, tenant, x, RequestKey(l+".tenant_id", l+".request_id"), key)
}

// RequestKeySQL is the expression of the partitions' unique index on
// request_id since migration 0067, `<partition>_request_key`: one 16-byte
// column, the MD5 of the tenant id's text and the request_id, where 0061's
// index had the tenant id beside the request_id's digest (32 bytes of key).
// The uuid's text is uuid_out's, 36 characters always, so the pair is read
// back from the concatenation unambiguously with no separator; uuid_out,
// textin (the cast has no pg_cast entry: it is I/O coercion), textcat and
// md5(text) are immutable, which an index expression must be, whereas
// convert_to, the way to bytes of a uuid_send(tenant_id) || request_id
// formulation, is only stable. It is the formulation of the idempotency
// records' index since 0032 (idempotency.KeyDigest).
var RequestKeySQL = RequestKey("tenant_id", "request_id")

// RequestKey is RequestKeySQL of the tenant and request_id expressions
// given.
func RequestKey(tenant, requestID string) string {
	return "md5(" + tenant + "::text || " + requestID + ")::uuid"
}

// RequestDigestSQL is the second column of the unique index on request_id
// of the partitions made from migration 0061 to 0067,
// `<partition>_request_digest` on (tenant_id, RequestDigestSQL): the MD5
// of the request_id, 16 bytes as a uuid, whatever the request_id's length.
const RequestDigestSQL = `md5(request_id)::uuid`

// LogsByRequestIDSQL reads the tenant's logs recorded under the
// request_ids in $2: one index probe a request_id in each partition kept,
// as long as it is kept (LIMIT 1 stops at the first found). Old
// partitions receive no new log (ids are minted at ingest), so reading
// them is enough there; across the current bound the claims referee
// (ClaimRequestIDsSQL).
//
// A request_id's digest of tenant and request_id, the key of every
// partition's probe since 0067, is computed once, in r (OFFSET 0 keeps the
// planner from folding r into the probes), not in each probe: stated in
// the probe's condition it was computed again at every rescan of every
// partition, an MD5 and a cast a partition kept. The request_id's own
// digest, which only partitions of 0061's shape probe on, stays in the
// condition: elsewhere it is a filter on a log found, computed for those
// alone. A batch of 1,000 new request_ids of a month holding 800,000
// logs, generic plans as ingest runs them: 10.0 ms against 6.7
// (docs/benchmarks.md, "The request_id digest computed once").
var LogsByRequestIDSQL = `SELECT ` + LogColumns + `
	FROM (SELECT r.rid, ` + RequestKey("$1::uuid", "r.rid") + ` AS rkey
		FROM unnest($2::text[]) AS r (rid) OFFSET 0) AS r
	CROSS JOIN LATERAL (
		SELECT * FROM usage_logs l WHERE ` + requestIDMatches("l", "$1", "r.rid", "r.rkey") + ` LIMIT 1) AS u`

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

// OverageInputSQL and OverageOutputSQL read a log's overage on the default
// input and output meters, the log named by alias ("" for a statement on
// usage_logs alone): NULL when it equals the log's input_tokens or
// output_tokens (since 0069 InsertSQL stores it so: 16 of a batched log's
// 176 bytes of tuple; the column's comment says so), the column otherwise.
// Every read of the two columns goes through them: a bare column would
// read NULL, which sum() passes over and a comparison never matches.
func OverageInputSQL(alias string) string {
	return "coalesce(" + qualify(alias, "overage_input_tokens") + ", " + qualify(alias, "input_tokens") + ")"
}

// OverageOutputSQL: see OverageInputSQL.
func OverageOutputSQL(alias string) string {
	return "coalesce(" + qualify(alias, "overage_output_tokens") + ", " + qualify(alias, "output_tokens") + ")"
}

// InputAcceptedAtSQL, OutputAcceptedAtSQL and OutputReportLeadSQL read a
// log's accepted times and output lead, the log named by alias as for
// OverageInputSQL. The acceptance that bills a log nothing else ever
// changed (updated_at NULL) writes NULL for what the log would hold twice
// (migration 0073): the accepted time of a dimension accepted with the
// billing, which is billed_at, and an output lead equal to the input
// lead. Billed is final and every other change of a log sets updated_at
// (review, parking, a report closed), so "billed with updated_at NULL"
// marks the logs so written without a column of its own; in any other log
// a NULL accepted time still means Stripe never accepted the dimension
// (a review's resolution to billed leaves it so). Every read of a log that
// may be billed goes through them, but for billed's recent, whose
// greatest() takes billed_at already. Formation, parking and review read
// the columns bare: they read pending or parked logs, never so written.
func InputAcceptedAtSQL(alias string) string {
	return acceptedAtSQL(alias, "input_accepted_at", OverageInputSQL(alias))
}

// OutputAcceptedAtSQL: see InputAcceptedAtSQL.
func OutputAcceptedAtSQL(alias string) string {
	return acceptedAtSQL(alias, "output_accepted_at", OverageOutputSQL(alias))
}

// OutputReportLeadSQL: see InputAcceptedAtSQL.
func OutputReportLeadSQL(alias string) string {
	return "coalesce(" + qualify(alias, "output_report_lead") + ", CASE WHEN " + billedByAcceptanceSQL(alias) +
		" AND " + OverageOutputSQL(alias) + " <> 0 THEN " + qualify(alias, "input_report_lead") + " END)"
}

func acceptedAtSQL(alias, column, overage string) string {
	return "coalesce(" + qualify(alias, column) + ", CASE WHEN " + billedByAcceptanceSQL(alias) +
		" AND " + overage + " <> 0 THEN " + qualify(alias, "billed_at") + " END)"
}

// billedByAcceptanceSQL is whether the log was billed by an acceptance
// and changed by nothing else: the logs 0073's NULLs may stand in.
func billedByAcceptanceSQL(alias string) string {
	return "(" + qualify(alias, "billing_status") + " = 'billed' AND " + qualify(alias, "updated_at") + " IS NULL)"
}

func qualify(alias, column string) string {
	if alias == "" {
		return column
	}
	return alias + "." + column
}

var LogColumns = `id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
	cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens,
	` + OverageInputSQL("") + `, ` + OverageOutputSQL("") + `, billing_status, billed_at, created_at,
	first_attempt_at, billing_message, ` + InputAcceptedAtSQL("") + `, ` + OutputAcceptedAtSQL("") + `, input_report_lead, ` + OutputReportLeadSQL("") + `,
	corrects, correction_reason, meter_keys, ` + MeterTokensSQL + `, meter_overage, meter_leads, meter_accepted_at, corrected_by,
	coalesce(stripe_timestamp, 'usage')`

// GetLogSQL reads the log $1.
var GetLogSQL = `SELECT ` + LogColumns + ` FROM usage_logs WHERE id = $1`

// CorrectionsOfSQL reads the corrections of the log $1, oldest first.
var CorrectionsOfSQL = `SELECT ` + LogColumns + ` FROM usage_logs WHERE corrects = $1 ORDER BY id`

// ByRequestIDSQL is a page of the logs of tenant $1 under request_id $2
// (a stream's, or the one recorded under it) after id $3, at most $4.
// The request_id arm states every index's condition (RequestIDIs).
var ByRequestIDSQL = `SELECT ` + LogColumns + ` FROM usage_logs
		WHERE tenant_id = $1 AND (stream_request_id = $2 OR (` + RequestIDIs("usage_logs", "$1", "$2") + `)) AND ($3::uuid IS NULL OR id > $3)
		ORDER BY id LIMIT $4`

// LogsByIDSQL reads the logs of the ids $1: one probe an id, of its
// partition only whatever the plan. A generic plan cannot prune on
// id = ANY($1); here each id is a parameter of the nested loop (LIMIT 1
// keeps the subquery from being flattened into a join the planner may
// hash), which prunes each probe to its partition.
var LogsByIDSQL = `SELECT ` + LogColumns + ` FROM unnest($1::uuid[]) AS k (kid)
	CROSS JOIN LATERAL (SELECT * FROM usage_logs l WHERE l.id = k.kid LIMIT 1) AS u`

// LockLogSQL reads and locks the log $1: the referee of two corrections
// of one log.
var LockLogSQL = `SELECT ` + LogColumns + ` FROM usage_logs WHERE id = $1 FOR UPDATE`

// TenantOfLogSQL reads the tenant of the log $1.
const TenantOfLogSQL = `SELECT tenant_id FROM usage_logs WHERE id = $1`

// PlainLogByRequestIDSQL reads the log a plain event of the tenant $1
// recorded under the request_id $2 (not a stream's), in every partition
// kept, as LogsByRequestIDSQL.
var PlainLogByRequestIDSQL = `SELECT ` + LogColumns + ` FROM usage_logs u
	WHERE ` + RequestIDIs("u", "$1", "$2") + ` AND u.stream_request_id IS NULL`

// StreamLogsSQL reads the logs of the stream $2 of the tenant $1: its
// increases and the corrections its final checkpoints made.
var StreamLogsSQL = `SELECT ` + LogColumns + ` FROM usage_logs WHERE tenant_id = $1 AND stream_request_id = $2`

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
