package ingest

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/usagelog"
)

// The usage_logs SQL of ingest: every statement ingest reads usage logs
// with is here; the one that adds them is usagelog.InsertSQL, written by
// the commit of the one ingest transaction (txn.go). The state
// transitions of billing belong to usagelog.

// logsByRequestIDSQL reads the tenant's logs recorded under the
// request_ids in $2: one index probe a request_id, as idempotency.LookupSQL.
var logsByRequestIDSQL = `SELECT ` + logColumns + `
	FROM unnest($2::text[]) AS r (rid)
	CROSS JOIN LATERAL (
		SELECT * FROM usage_logs l WHERE l.tenant_id = $1 AND l.request_id = r.rid LIMIT 1) AS u`

const logColumns = `id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
	cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens,
	overage_input_tokens, overage_output_tokens, billing_status, billed_at, created_at,
	first_attempt_at, billing_message, input_accepted_at, output_accepted_at, input_report_lead, output_report_lead,
	corrects, correction_reason, meter_keys, meter_tokens, meter_overage, meter_leads, meter_accepted_at, corrected_by,
	coalesce(stripe_timestamp, 'usage')`

func scanLog(row pgx.Row) (*overage.UsageLog, error) {
	l := &overage.UsageLog{}
	var inAt, outAt *time.Time
	var inLead, outLead *uuid.UUID
	var keys []string
	var tokens, over []int64
	var leads []pgtype.UUID
	var accepted []pgtype.Timestamptz
	if err := row.Scan(&l.ID, &l.TenantID, &l.RequestID, &l.Timestamp, &l.UserID, &l.ModelID, &l.InputTokens, &l.OutputTokens,
		&l.CacheRead, &l.CacheWrite, &l.Reasoning,
		&l.Overage.InputTokens, &l.Overage.OutputTokens, &l.BillingStatus, &l.BilledAt, &l.CreatedAt,
		&l.FirstAttemptAt, &l.BillingMessage, &inAt, &outAt, &inLead, &outLead, &l.Corrects, &l.Reason,
		&keys, &tokens, &over, &leads, &accepted, &l.CorrectedBy, &l.StripeTimestamp); err != nil {
		return nil, err
	}
	lines, err := rowLines(l, inLead, outLead, inAt, outAt, keys, tokens, over, leads, accepted)
	if err != nil {
		return nil, err
	}
	l.Meters = lines
	l.Kind = overage.KindUsage
	if l.Corrects != nil {
		l.Kind = overage.KindCorrection
	}
	l.Timestamp = l.Timestamp.UTC()
	l.CreatedAt = l.CreatedAt.UTC()
	l.StripeEvents = meterEvents(l.Overage, [2]*uuid.UUID{inLead, outLead}, [2]*time.Time{inAt, outAt})
	return l, nil
}

// meterEvents names, per dimension with overage, the meter event that
// carries it: the report led by leads[i] (nil until the log joins one), and
// when Stripe accepted it.
func meterEvents(o overage.Overage, leads [2]*uuid.UUID, accepted [2]*time.Time) []overage.StripeEvent {
	n := 0
	for _, d := range overage.Dimensions {
		if o.Of(d) != 0 {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]overage.StripeEvent, 0, n)
	for i, d := range overage.Dimensions {
		if v := o.Of(d); v != 0 {
			e := overage.StripeEvent{Dimension: d, Value: v, AcceptedAt: accepted[i]}
			if leads[i] != nil {
				key := overage.MeterEventKey(*leads[i], d)
				e.Identifier = &key
			}
			out = append(out, e)
		}
	}
	return out
}

// getLogSQL reads the log $1.
const getLogSQL = `SELECT ` + logColumns + ` FROM usage_logs WHERE id = $1`

// correctionsOfSQL reads the corrections of the log $1, oldest first.
const correctionsOfSQL = `SELECT ` + logColumns + ` FROM usage_logs WHERE corrects = $1 ORDER BY id`

// byRequestIDSQL is a page of the logs of tenant $1 under request_id $2
// (a stream's, or the one recorded under it) after id $3, at most $4.
const byRequestIDSQL = `SELECT ` + logColumns + ` FROM usage_logs
		WHERE tenant_id = $1 AND (stream_request_id = $2 OR request_id = $2) AND ($3::uuid IS NULL OR id > $3)
		ORDER BY id LIMIT $4`

// logsByIDSQL reads the logs of the ids $1.
const logsByIDSQL = `SELECT ` + logColumns + ` FROM usage_logs WHERE id = ANY($1)`

// lockLogSQL reads and locks the log $1: the referee of two corrections
// of one log.
const lockLogSQL = `SELECT ` + logColumns + ` FROM usage_logs WHERE id = $1 FOR UPDATE`

// tenantOfLogSQL reads the tenant of the log $1.
const tenantOfLogSQL = `SELECT tenant_id FROM usage_logs WHERE id = $1`

// plainLogByRequestIDSQL reads the log a plain event of the tenant $1
// recorded under the request_id $2 (not a stream's).
const plainLogByRequestIDSQL = `SELECT ` + logColumns + ` FROM usage_logs
	WHERE tenant_id = $1 AND request_id = $2 AND stream_request_id IS NULL`

// streamLogsSQL reads the logs of the stream $2 of the tenant $1: its
// increases and the corrections its final checkpoints made.
const streamLogsSQL = `SELECT ` + logColumns + ` FROM usage_logs WHERE tenant_id = $1 AND stream_request_id = $2`

// correctedPeriodSQL reads, for the correction of the log $2 of the tenant
// $1, the log's allowance period, the period of now, whether the log's
// period is closed ($3 being PERIOD_CLOSE_GRACE in seconds:
// usagelog.PeriodClosedSQL, the one rule) and now().
var correctedPeriodSQL = `SELECT u.period_start, ` + periodOfSQL("now()") + `,
		` + usagelog.PeriodClosedSQL("$1", "u.period_start", "$3") + `,
		now()
	FROM usage_logs u WHERE u.id = $2`

// closedSinceSQL reads whether the log $1, recorded while its period was
// open and not yet in a report (stripe_timestamp NULL), is in a period
// closed now ($2 being PERIOD_CLOSE_GRACE in seconds).
var closedSinceSQL = `SELECT u.stripe_timestamp IS NULL AND ` + usagelog.PeriodClosedSQL("u.tenant_id", "u.period_start", "$2") + `
	FROM usage_logs u WHERE u.id = $1`

// readRecordedLogs reads the logs of the live compact records among recs,
// by id (none: no query).
func readRecordedLogs(ctx context.Context, q overage.DB, recs map[string]storedResponse) (map[uuid.UUID]*overage.UsageLog, error) {
	var ids pgArray[pgtype.UUID]
	for _, r := range recs {
		if logs, _, ok := r.compactLogs(); ok && !r.expired {
			for _, id := range logs {
				ids = append(ids, pgUUID(id))
			}
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, logsByIDSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("read the usage logs of stored answers: %w", err)
	}
	defer rows.Close()
	out := make(map[uuid.UUID]*overage.UsageLog, len(ids))
	for rows.Next() {
		l, err := scanLog(rows)
		if err != nil {
			return nil, fmt.Errorf("read the usage logs of stored answers: %w", err)
		}
		out[l.ID] = l
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the usage logs of stored answers: %w", err)
	}
	return out, nil
}
