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

// Ingest's reads of usage logs: the statements are usagelog's
// (usagelog/logreads.go), the scans into overage.UsageLog are here; the
// insert is usagelog.InsertSQL, written by the commit of the one ingest
// transaction (txn.go).

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

// usagelog's statements on usage_logs, by the names ingest's code uses.
var (
	logsByRequestIDSQL     = usagelog.LogsByRequestIDSQL
	logColumns             = usagelog.LogColumns
	getLogSQL              = usagelog.GetLogSQL
	correctionsOfSQL       = usagelog.CorrectionsOfSQL
	byRequestIDSQL         = usagelog.ByRequestIDSQL
	logsByIDSQL            = usagelog.LogsByIDSQL
	lockLogSQL             = usagelog.LockLogSQL
	tenantOfLogSQL         = usagelog.TenantOfLogSQL
	plainLogByRequestIDSQL = usagelog.PlainLogByRequestIDSQL
	streamLogsSQL          = usagelog.StreamLogsSQL
	correctedPeriodSQL     = usagelog.CorrectedPeriodSQL
	closedSinceSQL         = usagelog.ClosedSinceSQL
)
