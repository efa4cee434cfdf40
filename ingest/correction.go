package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/internal/httpx"
	"github.com/overage-billing/overage/usagelog"
)

// Corrections. Usage recorded wrongly is never edited: a correction is a
// new usage log (kind correction, corrects = the original) holding the
// difference between the corrected totals and the original's current ones
// (its tokens plus its earlier corrections'), in the original's allowance
// period. Its overage per dimension is the change of the period's overage,
// max(0, T'-A) - max(0, T-A), so a refund never exceeds what was billed
// and the allowance is given back. It is reported like any log: a
// negative report value is a valid Stripe meter event.
//
// One transaction, under the same idempotency contract as ingest: the key's
// advisory lock and stored answer; the original's row lock (FOR UPDATE), the
// referee of two corrections of one log; the period's advisory lock and its
// allowance rows (FOR UPDATE), so the totals T the overage is computed from
// are those every ordered ingest event sees; then the log, the period total,
// the report job and the stored answer are written together.

// Where a correction's Stripe timestamp comes from.
const (
	// TimestampOriginal: the original's period is still open, so the
	// correction lands in the same invoice as the usage it corrects.
	TimestampOriginal = "original"
	// TimestampCorrection: the original's period is closed (its invoice may
	// be final and is never changed), so the correction is timestamped now.
	TimestampCorrection = "correction"
)

// stripeTimestampMargin keeps an original's timestamp clear of Stripe's
// 35-day limit while the correction waits in a report.
const stripeTimestampMargin = 24 * time.Hour

// CorrectedByAdmin is corrected_by for a correction made with ADMIN_TOKEN
// or by `overage correct`.
const CorrectedByAdmin = "admin"

// DefaultPeriodCloseGrace is PERIOD_CLOSE_GRACE's default: how long after
// a billing period ends Stripe still takes usage for it, and a tenant's key
// may still correct it.
const DefaultPeriodCloseGrace = usagelog.DefaultPeriodCloseGrace

// SetPeriodCloseGrace sets PERIOD_CLOSE_GRACE (d > 0): a period that ended
// longer ago than d is closed, and only an administrator corrects its logs.
func (s *Service) SetPeriodCloseGrace(d time.Duration) {
	if d > 0 {
		s.periodCloseGrace = d
	}
}

// CorrectParams are the inputs of Correct, validated by the caller.
type CorrectParams struct {
	// TenantID is the caller's tenant; nil for an administrator, who alone
	// may correct a log of a closed period.
	TenantID *uuid.UUID
	// KeyID is the API key of the caller's tenant that asks, recorded as
	// corrected_by; ignored for an administrator (corrected_by "admin").
	KeyID        uuid.UUID
	UsageLogID   uuid.UUID
	Key          string
	Fingerprint  []byte
	InputTokens  int64
	OutputTokens int64
	// Parts are the corrected parts given (nil: keep the original's, cut
	// to fit the corrected totals).
	Parts  overage.TokenParts
	Reason string
}

// correctionResponse is the JSON of a correction's answer.
type correctionResponse struct {
	*overage.UsageLog
	// StripeTimestamp says which time the meter event carries.
	StripeTimestamp string `json:"stripe_timestamp"`
}

// Correct records a correction of a usage log; see above.
func (s *Service) Correct(ctx context.Context, p CorrectParams) (*Outcome, error) {
	return withRetries(func() (*Outcome, error) { return s.correctOnce(ctx, p) })
}

func (s *Service) correctOnce(ctx context.Context, p CorrectParams) (*Outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	slot := s.slots.take()
	defer s.slots.give(slot)
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin correction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	// The key's scope is the log's tenant, for an administrator too.
	var tenantID uuid.UUID
	err = tx.QueryRow(ctx, `SELECT tenant_id FROM usage_logs WHERE id = $1`, p.UsageLogID).Scan(&tenantID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && p.TenantID != nil && *p.TenantID != tenantID) {
		return nil, overage.NotFound("usage log %s not found", p.UsageLogID)
	}
	if err != nil {
		return nil, fmt.Errorf("read usage log: %w", err)
	}
	k, err := claimKey(ctx, tx, tenantID, p.Key, p.Fingerprint, slot)
	if err != nil {
		return nil, err
	}
	if k.replay != nil {
		return k.replay, nil
	}

	orig, err := scanLog(tx.QueryRow(ctx, `SELECT `+logColumns+` FROM usage_logs WHERE id = $1 FOR UPDATE`, p.UsageLogID))
	if err != nil {
		return nil, fmt.Errorf("lock usage log: %w", err)
	}
	if err := s.present(ctx, tx, orig); err != nil {
		return nil, err
	}
	if orig.Corrects != nil {
		return nil, overage.Invalid([]overage.FieldError{{Field: "id", Detail: "is a correction; correct the usage log it corrects"}},
			"usage log %s is a correction of %s: correct that one", orig.ID, orig.Corrects)
	}
	earlier, err := s.correctionsOf(ctx, tx, orig.ID)
	if err != nil {
		return nil, err
	}
	cur := overage.Overage{InputTokens: orig.InputTokens, OutputTokens: orig.OutputTokens}
	for _, c := range earlier {
		cur.InputTokens += c.InputTokens
		cur.OutputTokens += c.OutputTokens
	}
	delta := overage.Overage{InputTokens: p.InputTokens - cur.InputTokens, OutputTokens: p.OutputTokens - cur.OutputTokens}
	cat, err := s.meters.Knowing(ctx, tx, nil)
	if err != nil {
		return nil, err
	}
	lines := correctionLines(cat, orig, earlier, p.InputTokens, p.OutputTokens, p.Parts)
	if delta.InputTokens == 0 && delta.OutputTokens == 0 && !billableTokens(lines) {
		return nil, overage.Invalid([]overage.FieldError{{Field: fieldInputTokens, Detail: "equals the current totals: nothing to correct"}},
			"usage log %s already totals %d input and %d output tokens: nothing to correct", orig.ID, cur.InputTokens, cur.OutputTokens)
	}
	by := CorrectedByAdmin
	if p.TenantID != nil {
		by = p.KeyID.String()
	}
	c, basis, err := correctionOf(ctx, tx, orig, delta, p.Reason, by, p.TenantID == nil, s.closeGrace())
	if err != nil {
		return nil, err
	}
	c.lines = lines
	if err := c.compute(ctx, tx, cat); err != nil {
		return nil, err
	}
	body, err := json.Marshal(correctionResponse{UsageLog: c.log, StripeTimestamp: basis})
	if err != nil {
		return nil, fmt.Errorf("render correction: %w", err)
	}
	out := &Outcome{Status: http.StatusAccepted, Body: body, Kind: OutcomeNew, UsageLogID: c.log.ID}
	if err := writeDeltaLogs(ctx, tx, s.outbox, tenantID, []*deltaLog{c}); err != nil {
		return nil, err
	}
	if err := k.store(ctx, tx, out); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit correction: %w", err)
	}
	return out, nil
}

// correctionOf is the correction of orig by delta tokens, to be computed,
// and where its Stripe timestamp comes from: the original's while the
// original's allowance period is still open, else now. by is recorded as
// corrected_by. Unless mayCloseOld (an administrator), a log of a closed
// period — one that ended longer than grace ago — is refused: its invoice
// may be final, and refunding invoiced usage is an operator's decision
// (403 period-closed).
func correctionOf(ctx context.Context, tx pgx.Tx, orig *overage.UsageLog, delta overage.Overage, reason, by string,
	mayCloseOld bool, grace time.Duration) (*deltaLog, string, error) {
	var period, nowPeriod, now time.Time
	var closed bool
	// Closed: usagelog.PeriodClosedSQL, the one rule.
	if err := tx.QueryRow(ctx, `SELECT u.period_start, `+periodOfSQL("now()")+`,
			`+usagelog.PeriodClosedSQL("$1", "u.period_start", "$3")+`,
			now()
		FROM usage_logs u WHERE u.id = $2`, orig.TenantID, orig.ID, grace.Seconds()).Scan(&period, &nowPeriod, &closed, &now); err != nil {
		return nil, "", fmt.Errorf("read the period of %s: %w", orig.ID, err)
	}
	if closed && !mayCloseOld {
		return nil, "", overage.Errorf(overage.EFORBIDDEN, "period-closed",
			"usage log %s is in the billing period that began %s, closed (it ended more than PERIOD_CLOSE_GRACE, %s, ago): only an administrator (ADMIN_TOKEN) may correct it",
			orig.ID, period.UTC().Format(time.RFC3339), grace)
	}
	now = now.UTC().Truncate(time.Microsecond)
	id, err := uuid.NewV7()
	if err != nil {
		return nil, "", fmt.Errorf("usage log id: %w", err)
	}
	l := &overage.UsageLog{
		ID: id, TenantID: orig.TenantID, Timestamp: orig.Timestamp, UserID: orig.UserID, ModelID: orig.ModelID,
		InputTokens: delta.InputTokens, OutputTokens: delta.OutputTokens,
		Kind: overage.KindCorrection, Corrects: &orig.ID, Reason: &reason, CorrectedBy: &by,
		StripeTimestamp: usagelog.TimestampUsage,
	}
	if closed {
		// Its report is formed after now, its period closed for good.
		l.StripeTimestamp = usagelog.TimestampReported
	}
	basis := TimestampOriginal
	if !nowPeriod.UTC().Equal(period.UTC()) || orig.Timestamp.Before(now.Add(-maxEventAge+stripeTimestampMargin)) {
		basis, l.Timestamp = TimestampCorrection, now
	}
	return &deltaLog{log: l, period: period.UTC()}, basis, nil
}

// closeGrace is PERIOD_CLOSE_GRACE, its default unless set.
func (s *Service) closeGrace() time.Duration {
	if s.periodCloseGrace > 0 {
		return s.periodCloseGrace
	}
	return DefaultPeriodCloseGrace
}

// periodOfSQL is the SQL of the allowance period start of the tenant $1 at
// the instant ts: its Stripe subscription period covering ts when the
// webhooks told us one, else ts's calendar month in UTC (as periodsSQL).
func periodOfSQL(ts string) string { return usagelog.PeriodOfSQL("$1", ts) }

// keyClaim is an idempotency key taken by a transaction outside the
// pipelined ingest path (corrections, stream checkpoints).
type keyClaim struct {
	tenantID    uuid.UUID
	key         string
	fingerprint []byte
	expired     *expiredKey
	// replay, when set, is the answer: the stored one, byte for byte.
	replay *Outcome
}

// claimKey takes the key's advisory lock and reads its stored answer, as
// the ingest transaction does: a live answer is replayed (or refused as key
// reuse); a key held by a request still executing is 409 in progress.
//
// The transaction writes the counter rows of slot (see slots.go): a slot no
// other transaction holds, so its counter rows never make it wait for, or
// deadlock with, a report worker that holds the usage log it corrects.
func claimKey(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, key string, fp []byte, slot int16) (*keyClaim, error) {
	k := &keyClaim{tenantID: tenantID, key: key, fingerprint: fp}
	dest := make([]any, txSettingsColumns+1, txSettingsColumns+2)
	var locked bool
	if err := tx.QueryRow(ctx, `SELECT `+txSettingsSQL+`, set_config('overage.slot', $2::int::text, true), pg_try_advisory_xact_lock($1)`,
		lockKey(tenantID, key), slot).Scan(append(dest, &locked)...); err != nil {
		return nil, fmt.Errorf("take idempotency lock: %w", err)
	}
	var rec storedResponse
	err := tx.QueryRow(ctx, idempotency.LookupSQL, tenantID, []string{key}).
		Scan(nil, &rec.fingerprint, &rec.status, &rec.body, &rec.usageLogID, &rec.expiresAt, &rec.expired)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, fmt.Errorf("read idempotency record: %w", err)
	case !rec.expired:
		recorded, err := readRecordedLogs(ctx, tx, map[string]storedResponse{key: rec})
		if err != nil {
			return nil, err
		}
		out, err := rec.replay(fp, recorded)
		k.replay = out
		return k, err
	default:
		k.expired = &expiredKey{key, rec.expiresAt}
	}
	if !locked {
		return nil, errInProgress()
	}
	return k, nil
}

// store writes the answer under the key, replacing an expired record.
func (k *keyClaim) store(ctx context.Context, tx pgx.Tx, out *Outcome) error {
	if k.expired != nil {
		if _, err := tx.Exec(ctx, idempotency.DeleteExpiredSQL, k.tenantID, k.key, k.expired.expiresAt); err != nil {
			return fmt.Errorf("delete expired idempotency record: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, idempotency.InsertSQL, k.tenantID, []string{k.key}, [][]byte{k.fingerprint}, []int32{int32(out.Status)},
		[][]byte{out.Body}, []pgtype.UUID{nullID(out.UsageLogID)}, KeyTTL.Seconds()); err != nil {
		return fmt.Errorf("store answer: %w", err)
	}
	return nil
}

// deltaLog is a usage log that changes its period's total by its tokens
// (a stream's increase, a correction's difference): its overage is the
// change of the period's overage, computed under the period's lock.
type deltaLog struct {
	log       *overage.UsageLog
	period    time.Time
	streamRID *string
	// lines are its tokens per meter, the defaults first (always both):
	// what it adds to each meter's period total.
	lines []overage.MeterTokens
	// split is lines with their overage, set by compute.
	split []overage.MeterLine
}

// compute orders the log with every ingest event of its period that still
// sees allowance left (the same advisory lock) and after every writer of
// the period's slot rows that has written them (their row locks), reads
// each of its meters' period total T and sets the line's overage to
// overage.Split(T, d, A).
func (d *deltaLog) compute(ctx context.Context, tx pgx.Tx, cat *overage.Catalog) error {
	a, b := periodLockKey(d.log.TenantID, d.period)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int4, $2::int4)`, a, b); err != nil {
		return fmt.Errorf("lock allowance period: %w", err)
	}
	var total, allowance overage.Overage
	var included map[string]int64
	var now time.Time
	if err := tx.QueryRow(ctx, `WITH locked AS (
			SELECT input_tokens, output_tokens FROM allowance_usage WHERE tenant_id = $1 AND period_start = $2 FOR UPDATE
		)
		SELECT (SELECT coalesce(sum(input_tokens), 0)::bigint FROM locked), (SELECT coalesce(sum(output_tokens), 0)::bigint FROM locked),
			t.included_input_tokens, t.included_output_tokens, t.included_meters, now()
		FROM tenants t WHERE t.id = $1`, d.log.TenantID, d.period).Scan(&total.InputTokens, &total.OutputTokens,
		&allowance.InputTokens, &allowance.OutputTokens, &included, &now); err != nil {
		return fmt.Errorf("read allowance totals: %w", err)
	}
	extra := map[string]int64{}
	if len(d.lines) > 2 {
		var keys []string
		for _, ln := range d.lines[2:] {
			keys = append(keys, ln.Meter)
		}
		rows, err := tx.Query(ctx, `SELECT meter, coalesce(sum(tokens), 0)::bigint FROM (
				SELECT meter, tokens FROM meter_usage WHERE tenant_id = $1 AND period_start = $2 AND meter = ANY($3)
				ORDER BY meter COLLATE "C", slot FOR UPDATE) AS m
			GROUP BY meter`, d.log.TenantID, d.period, keys)
		if err != nil {
			return fmt.Errorf("read meter totals: %w", err)
		}
		for rows.Next() {
			var k string
			var n int64
			if err := rows.Scan(&k, &n); err != nil {
				rows.Close()
				return fmt.Errorf("read meter totals: %w", err)
			}
			extra[k] = n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read meter totals: %w", err)
		}
	}
	l := d.log
	d.split = make([]overage.MeterLine, len(d.lines))
	for i, ln := range d.lines {
		var t, inc int64
		switch ln.Meter {
		case overage.MeterInput:
			t, inc = total.InputTokens, allowance.InputTokens
		case overage.MeterOutput:
			t, inc = total.OutputTokens, allowance.OutputTokens
		default:
			t, inc = extra[ln.Meter], included[ln.Meter]
		}
		if ln.Tokens > 0 && t > maxTotal-ln.Tokens {
			return errTotalOverflow
		}
		d.split[i] = overage.MeterLine{Meter: ln.Meter, Tokens: ln.Tokens, Overage: overage.Split(t, ln.Tokens, inc)}
	}
	l.CreatedAt = now.UTC().Truncate(time.Microsecond)
	l.BillingStatus = overage.BillingStatusNotBillable
	if billable(d.split) {
		l.BillingStatus = overage.BillingStatusPending
	}
	l.Meters = rawLines(l, d.split)
	cat.Present(l)
	return nil
}

// writeDeltaLogs queues the report job of the billable logs (first, as the
// ingest transaction does: see migrations/0007), then adds each log's
// tokens to its period's ordered rows (slot 0: allowance_usage, then
// meter_usage) and inserts the logs.
func writeDeltaLogs(ctx context.Context, tx pgx.Tx, ob interface {
	InsertReportsTx(context.Context, pgx.Tx, uuid.UUID, []uuid.UUID) error
}, tenantID uuid.UUID, logs []*deltaLog) error {
	var billableIDs []uuid.UUID
	for _, d := range logs {
		if billable(d.split) {
			billableIDs = append(billableIDs, d.log.ID)
		}
	}
	if len(billableIDs) > 0 {
		if err := ob.InsertReportsTx(ctx, tx, tenantID, billableIDs); err != nil {
			return err
		}
	}
	for _, d := range logs {
		l := d.log
		if _, err := tx.Exec(ctx, `INSERT INTO allowance_usage AS a (tenant_id, period_start, slot, input_tokens, output_tokens)
			VALUES ($1, $2, 0, $3, $4)
			ON CONFLICT (tenant_id, period_start, slot) DO UPDATE
			SET input_tokens = a.input_tokens + EXCLUDED.input_tokens, output_tokens = a.output_tokens + EXCLUDED.output_tokens`,
			tenantID, d.period, d.split[0].Tokens, d.split[1].Tokens); err != nil {
			return fmt.Errorf("write allowance total: %w", err)
		}
		var keys []string
		var tokens, over []int64
		for _, ln := range d.split[2:] {
			keys, tokens, over = append(keys, ln.Meter), append(tokens, ln.Tokens), append(over, ln.Overage)
		}
		if len(keys) > 0 {
			if _, err := tx.Exec(ctx, `INSERT INTO meter_usage AS a (tenant_id, period_start, meter, slot, tokens)
				SELECT $1, $2, m.meter, 0, m.tokens FROM unnest($3::text[], $4::bigint[]) AS m (meter, tokens)
				ORDER BY m.meter COLLATE "C"
				ON CONFLICT (tenant_id, period_start, meter, slot) DO UPDATE SET tokens = a.tokens + EXCLUDED.tokens`,
				tenantID, d.period, keys, tokens); err != nil {
				return fmt.Errorf("write meter totals: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
				period_start, overage_input_tokens, overage_output_tokens, billing_status, created_at, updated_at,
				corrects, correction_reason, stream_request_id, meter_keys, meter_tokens, meter_overage, corrected_by, stripe_timestamp)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14, $15, $16, $17, $18, $19, $20,
				CASE WHEN $21 THEN 'reported' END)`,
			l.ID, tenantID, l.RequestID, l.Timestamp, l.UserID, l.ModelID, l.InputTokens, l.OutputTokens, d.period,
			d.split[0].Overage, d.split[1].Overage, string(l.BillingStatus), l.CreatedAt, l.Corrects, l.Reason, d.streamRID,
			keys, tokens, over, l.CorrectedBy, l.StripeTimestamp == usagelog.TimestampReported); err != nil {
			return fmt.Errorf("write usage log: %w", err)
		}
	}
	return nil
}

// meterDeltas is, per meter, target less have: the meters of target in its
// order (the default meters first), then the meters only have names — a
// share given back — in key order.
func meterDeltas(target []overage.MeterTokens, have map[string]int64) []overage.MeterTokens {
	lines := make([]overage.MeterTokens, 0, len(target)+len(have))
	seen := map[string]bool{}
	for _, t := range target {
		lines = append(lines, overage.MeterTokens{Meter: t.Meter, Tokens: t.Tokens - have[t.Meter]})
		seen[t.Meter] = true
	}
	var gone []string
	for k := range have {
		if !seen[k] {
			gone = append(gone, k)
		}
	}
	slices.Sort(gone)
	for _, k := range gone {
		lines = append(lines, overage.MeterTokens{Meter: k, Tokens: -have[k]})
	}
	return lines
}

func nonZeroExtras(lines []overage.MeterTokens) []overage.MeterTokens {
	out := lines[:2]
	for _, ln := range lines[2:] {
		if ln.Tokens != 0 {
			out = append(out, ln)
		}
	}
	return out
}

// correctionLines is what a correction of orig to the totals in and out
// changes on each meter: the corrected totals routed with cat, less what
// orig and its corrections (cur) already put on each meter. The corrected
// totals keep orig's reported parts, cut to fit the new totals, so a
// correction that voids a log takes back every meter's share, and one that
// changes output leaves input's meters alone.
func correctionLines(cat *overage.Catalog, orig *overage.UsageLog, cur []overage.UsageLog, in, out int64, given overage.TokenParts) []overage.MeterTokens {
	parts := overage.TokenParts{}
	clip := func(p *int64, room int64) *int64 {
		if p == nil {
			return nil
		}
		v := min(*p, max(room, 0))
		return &v
	}
	parts.CacheRead = clip(orig.CacheRead, in)
	if given.CacheRead != nil {
		parts.CacheRead = given.CacheRead
	}
	var read int64
	if parts.CacheRead != nil {
		read = *parts.CacheRead
	}
	parts.CacheWrite = clip(orig.CacheWrite, in-read)
	if given.CacheWrite != nil {
		parts.CacheWrite = clip(given.CacheWrite, in-read)
	}
	parts.Reasoning = clip(orig.Reasoning, out)
	if given.Reasoning != nil {
		parts.Reasoning = given.Reasoning
	}
	target := cat.Route(orig.ModelID).Lines(overage.Amounts(in, out, parts))
	have := map[string]int64{}
	for _, ln := range orig.Meters {
		have[ln.Meter] += ln.Tokens
	}
	for _, c := range cur {
		for _, ln := range c.Meters {
			have[ln.Meter] += ln.Tokens
		}
	}
	lines := meterDeltas(target, have)
	return nonZeroExtras(lines)
}

// correctionsOf reads the corrections of the log id, oldest first.
func (s *Service) correctionsOf(ctx context.Context, q querier, id uuid.UUID) ([]overage.UsageLog, error) {
	rows, err := q.Query(ctx, `SELECT `+logColumns+` FROM usage_logs WHERE corrects = $1 ORDER BY id`, id)
	if err != nil {
		return nil, fmt.Errorf("read corrections of %s: %w", id, err)
	}
	cs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (overage.UsageLog, error) {
		c, err := scanLog(row)
		if err != nil {
			return overage.UsageLog{}, err
		}
		return *c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read corrections of %s: %w", id, err)
	}
	for i := range cs {
		if err := s.present(ctx, q, &cs[i]); err != nil {
			return nil, err
		}
	}
	return cs, nil
}

// withCorrections adds to a usage log (not a correction) its corrections
// and its corrected totals.
func (s *Service) withCorrections(ctx context.Context, l *overage.UsageLog) error {
	if l.Corrects != nil {
		return nil
	}
	cs, err := s.correctionsOf(ctx, s.pool, l.ID)
	if err != nil {
		return err
	}
	tot := overage.Overage{InputTokens: l.InputTokens, OutputTokens: l.OutputTokens}
	for _, c := range cs {
		tot.InputTokens += c.InputTokens
		tot.OutputTokens += c.OutputTokens
	}
	l.Corrections, l.CorrectedTotals = cs, &tot
	return nil
}

var knownCorrectionFields = map[string]bool{"input_tokens": true, "output_tokens": true, "reason": true,
	fieldCacheRead: true, fieldCacheWrite: true, fieldReasoning: true}

// maxReasonLen bounds a correction's reason, which operators read.
const maxReasonLen = 1000

// parseCorrection decodes and validates a correction body.
func parseCorrection(body []byte) (in, out int64, parts overage.TokenParts, reason string, err error) {
	raw, err := decodeObject(body, "the body must be a JSON object")
	if err != nil {
		return 0, 0, parts, "", err
	}
	if err := refuseUnknown(raw, func(k string) bool { return knownCorrectionFields[k] }); err != nil {
		return 0, 0, parts, "", err
	}
	var fields []overage.FieldError
	tokens := func(name string) int64 {
		v, ok := raw[name]
		if !ok || string(v) == "null" {
			fields = append(fields, overage.FieldError{Field: name, Detail: "is required (the corrected total; 0 with the other 0 voids the usage event)"})
			return 0
		}
		n, err := strconv.ParseInt(string(v), 10, 64)
		switch {
		case err != nil:
			fields = append(fields, overage.FieldError{Field: name, Detail: "must be an integer"})
		case n < 0:
			fields = append(fields, overage.FieldError{Field: name, Detail: fmt.Sprintf("must not be below zero, got %d", n)})
		case n > maxTokens:
			fields = append(fields, overage.FieldError{Field: name, Detail: fmt.Sprintf("must be at most %d", int64(maxTokens))})
		}
		return n
	}
	in, out = tokens(fieldInputTokens), tokens("output_tokens")
	// The corrected parts, optional: those not given keep the original's
	// (cut to fit the corrected totals).
	part := func(name string) *int64 {
		if v, ok := raw[name]; !ok || string(v) == "null" {
			return nil
		}
		n := tokens(name)
		return &n
	}
	parts = overage.TokenParts{CacheRead: part(fieldCacheRead), CacheWrite: part(fieldCacheWrite), Reasoning: part(fieldReasoning)}
	if len(fields) == 0 {
		if c := parts.Input(); c > in {
			name := fieldCacheWrite
			if parts.CacheWrite == nil {
				name = fieldCacheRead
			}
			fields = append(fields, overage.FieldError{Field: name, Detail: fmt.Sprintf("makes %d cached input tokens, more than input_tokens (%d), which includes them", c, in)})
		}
		if parts.Reasoning != nil && *parts.Reasoning > out {
			fields = append(fields, overage.FieldError{Field: fieldReasoning, Detail: fmt.Sprintf("is %d, more than output_tokens (%d), which includes it", *parts.Reasoning, out)})
		}
	}
	if v, ok := raw["reason"]; !ok || string(v) == "null" {
		fields = append(fields, overage.FieldError{Field: "reason", Detail: "is required"})
	} else if err := json.Unmarshal(v, &reason); err != nil {
		fields = append(fields, overage.FieldError{Field: "reason", Detail: "must be a string"})
	} else if strings.TrimSpace(reason) == "" || len(reason) > maxReasonLen || strings.ContainsRune(reason, 0) {
		fields = append(fields, overage.FieldError{Field: "reason", Detail: fmt.Sprintf("must be 1 to %d characters, not blank, without NUL", maxReasonLen)})
	}
	if len(fields) > 0 {
		return 0, 0, parts, "", overage.Invalid(fields, "the correction is invalid: %s", describe(fields))
	}
	return in, out, parts, reason, nil
}

func (h *Handler) createCorrection(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, h.correct)
}

// correct runs the checks in ingest's order: authenticate (the owning
// tenant's key or ADMIN_TOKEN), validate, fingerprint, then the key.
func (h *Handler) correct(r *http.Request) (*Outcome, error) {
	var tenantID *uuid.UUID
	var keyID uuid.UUID
	if !httpx.IsAdmin(r, h.adminToken) {
		p, err := h.writer(r)
		if err != nil {
			return nil, err
		}
		tenantID, keyID = &p.TenantID, p.KeyID
	}
	key, body, err := readKeyAndBody(r, maxBodyBytes)
	if err != nil {
		return nil, err
	}
	logID, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		return nil, overage.NotFound("usage log %q not found", chi.URLParam(r, "id"))
	}
	in, out, parts, reason, err := parseCorrection(body)
	if err != nil {
		return nil, err
	}
	fp, err := fingerprint(r.Method, r.URL.Path, body)
	if err != nil {
		return nil, malformed("body", err.Error())
	}
	if tenantID != nil {
		release, err := h.admit(*tenantID, false)
		if err != nil {
			return nil, err
		}
		defer release()
	}
	return h.svc.Correct(r.Context(), CorrectParams{TenantID: tenantID, KeyID: keyID, UsageLogID: logID, Key: key, Fingerprint: fp,
		InputTokens: in, OutputTokens: out, Parts: parts, Reason: reason})
}

// CorrectionFingerprint is the fingerprint of the HTTP request that asks
// for this correction, so a correction made by the CLI and one made over
// HTTP under the same key are the same request.
func CorrectionFingerprint(id uuid.UUID, in, out int64, reason string) ([]byte, error) {
	body, err := json.Marshal(map[string]any{"input_tokens": in, "output_tokens": out, "reason": reason})
	if err != nil {
		return nil, fmt.Errorf("correction fingerprint: %w", err)
	}
	return fingerprint(http.MethodPost, "/v1/usage-events/"+id.String()+"/corrections", body)
}
