package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/alerts"
	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/internal/httpx"
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

// CorrectParams are the inputs of Correct, validated by the caller.
type CorrectParams struct {
	// TenantID is the caller's tenant; nil for an administrator.
	TenantID     *uuid.UUID
	UsageLogID   uuid.UUID
	Key          string
	Fingerprint  []byte
	InputTokens  int64
	OutputTokens int64
	Reason       string
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
	if orig.Corrects != nil {
		return nil, overage.Invalid([]overage.FieldError{{Field: "id", Detail: "is a correction; correct the usage log it corrects"}},
			"usage log %s is a correction of %s: correct that one", orig.ID, orig.Corrects)
	}
	var cur overage.Overage
	if err := tx.QueryRow(ctx, `SELECT u.input_tokens + coalesce(sum(c.input_tokens), 0)::bigint,
			u.output_tokens + coalesce(sum(c.output_tokens), 0)::bigint
		FROM usage_logs u LEFT JOIN usage_logs c ON c.corrects = u.id
		WHERE u.id = $1 GROUP BY u.id`, orig.ID).Scan(&cur.InputTokens, &cur.OutputTokens); err != nil {
		return nil, fmt.Errorf("read corrections of %s: %w", orig.ID, err)
	}
	delta := overage.Overage{InputTokens: p.InputTokens - cur.InputTokens, OutputTokens: p.OutputTokens - cur.OutputTokens}
	if delta.InputTokens == 0 && delta.OutputTokens == 0 {
		return nil, overage.Invalid([]overage.FieldError{{Field: fieldInputTokens, Detail: "equals the current totals: nothing to correct"}},
			"usage log %s already totals %d input and %d output tokens: nothing to correct", orig.ID, cur.InputTokens, cur.OutputTokens)
	}
	c, basis, err := correctionOf(ctx, tx, orig, delta, p.Reason)
	if err != nil {
		return nil, err
	}
	if err := c.compute(ctx, tx); err != nil {
		return nil, err
	}
	body, err := json.Marshal(correctionResponse{UsageLog: c.log, StripeTimestamp: basis})
	if err != nil {
		return nil, fmt.Errorf("render correction: %w", err)
	}
	out := &Outcome{Status: http.StatusAccepted, Body: body, Kind: OutcomeNew, UsageLogID: c.log.ID}
	if err := writeDeltaLogs(ctx, tx, s.outbox, s.alerts, tenantID, []*deltaLog{c}); err != nil {
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
// original's allowance period is still open, else now.
func correctionOf(ctx context.Context, tx pgx.Tx, orig *overage.UsageLog, delta overage.Overage, reason string) (*deltaLog, string, error) {
	var period, nowPeriod, now time.Time
	if err := tx.QueryRow(ctx, `SELECT u.period_start, `+periodOfSQL("now()")+`, now()
		FROM usage_logs u WHERE u.id = $2`, orig.TenantID, orig.ID).Scan(&period, &nowPeriod, &now); err != nil {
		return nil, "", fmt.Errorf("read the period of %s: %w", orig.ID, err)
	}
	now = now.UTC().Truncate(time.Microsecond)
	id, err := uuid.NewV7()
	if err != nil {
		return nil, "", fmt.Errorf("usage log id: %w", err)
	}
	l := &overage.UsageLog{
		ID: id, TenantID: orig.TenantID, Timestamp: orig.Timestamp, UserID: orig.UserID, ModelID: orig.ModelID,
		InputTokens: delta.InputTokens, OutputTokens: delta.OutputTokens,
		Kind: overage.KindCorrection, Corrects: &orig.ID, Reason: &reason,
	}
	basis := TimestampOriginal
	if !nowPeriod.UTC().Equal(period.UTC()) || orig.Timestamp.Before(now.Add(-maxEventAge+stripeTimestampMargin)) {
		basis, l.Timestamp = TimestampCorrection, now
	}
	return &deltaLog{log: l, period: period.UTC()}, basis, nil
}

// periodOfSQL is the SQL of the allowance period start of the tenant $1 at
// the instant ts: its Stripe subscription period covering ts when the
// webhooks told us one, else ts's calendar month in UTC (as periodsSQL).
func periodOfSQL(ts string) string {
	return `coalesce((SELECT s.current_period_start FROM tenant_subscriptions s
		WHERE s.tenant_id = $1 AND s.current_period_start <= ` + ts + ` AND ` + ts + ` < s.current_period_end
		ORDER BY s.current_period_start DESC LIMIT 1), date_trunc('month', ` + ts + `, 'UTC'))`
}

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
	// The period's totals before the log and the allowance, read by
	// compute under the period's lock.
	total, allowance overage.Overage
}

// compute orders the log with every ingest event of its period that still
// sees allowance left (the same advisory lock) and after every writer of
// the period's slot rows that has written them (their row locks), reads
// the period's total T and sets the log's overage to max(0, T+d-A) -
// max(0, T-A) per dimension.
func (d *deltaLog) compute(ctx context.Context, tx pgx.Tx) error {
	a, b := periodLockKey(d.log.TenantID, d.period)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int4, $2::int4)`, a, b); err != nil {
		return fmt.Errorf("lock allowance period: %w", err)
	}
	var total, allowance overage.Overage
	var now time.Time
	if err := tx.QueryRow(ctx, `WITH locked AS (
			SELECT input_tokens, output_tokens FROM allowance_usage WHERE tenant_id = $1 AND period_start = $2 FOR UPDATE
		)
		SELECT (SELECT coalesce(sum(input_tokens), 0)::bigint FROM locked), (SELECT coalesce(sum(output_tokens), 0)::bigint FROM locked),
			t.included_input_tokens, t.included_output_tokens, now()
		FROM tenants t WHERE t.id = $1`, d.log.TenantID, d.period).Scan(&total.InputTokens, &total.OutputTokens,
		&allowance.InputTokens, &allowance.OutputTokens, &now); err != nil {
		return fmt.Errorf("read allowance totals: %w", err)
	}
	change := func(t, d, a int64) int64 { return max(0, t+d-a) - max(0, t-a) }
	d.total, d.allowance = total, allowance
	l := d.log
	l.Overage = overage.Overage{
		InputTokens:  change(total.InputTokens, l.InputTokens, allowance.InputTokens),
		OutputTokens: change(total.OutputTokens, l.OutputTokens, allowance.OutputTokens),
	}
	l.CreatedAt = now.UTC().Truncate(time.Microsecond)
	l.BillingStatus = overage.BillingStatusNotBillable
	if l.Overage.Billable() {
		l.BillingStatus = overage.BillingStatusPending
	}
	l.StripeEvents = meterEvents(l.Overage, [2]*uuid.UUID{}, [2]*time.Time{})
	return nil
}

// writeDeltaLogs queues the report job of the billable logs (first, as the
// ingest transaction does: see migrations/0007), then adds each log's
// tokens to its period's ordered row (slot 0) and inserts the logs.
func writeDeltaLogs(ctx context.Context, tx pgx.Tx, ob interface {
	InsertReportsTx(context.Context, pgx.Tx, uuid.UUID, []uuid.UUID) error
}, rec *alerts.Recorder, tenantID uuid.UUID, logs []*deltaLog) error {
	var billable []uuid.UUID
	for _, d := range logs {
		if d.log.Overage.Billable() {
			billable = append(billable, d.log.ID)
		}
	}
	if len(billable) > 0 {
		if err := ob.InsertReportsTx(ctx, tx, tenantID, billable); err != nil {
			return err
		}
	}
	if err := rec.Record(ctx, tx, tenantID, deltaUsage(logs)...); err != nil {
		return err
	}
	for _, d := range logs {
		l := d.log
		if _, err := tx.Exec(ctx, `INSERT INTO allowance_usage AS a (tenant_id, period_start, slot, input_tokens, output_tokens)
			VALUES ($1, $2, 0, $3, $4)
			ON CONFLICT (tenant_id, period_start, slot) DO UPDATE
			SET input_tokens = a.input_tokens + EXCLUDED.input_tokens, output_tokens = a.output_tokens + EXCLUDED.output_tokens`,
			tenantID, d.period, l.InputTokens, l.OutputTokens); err != nil {
			return fmt.Errorf("write allowance total: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
				period_start, overage_input_tokens, overage_output_tokens, billing_status, created_at, updated_at,
				corrects, correction_reason, stream_request_id)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14, $15, $16)`,
			l.ID, tenantID, l.RequestID, l.Timestamp, l.UserID, l.ModelID, l.InputTokens, l.OutputTokens, d.period,
			l.Overage.InputTokens, l.Overage.OutputTokens, string(l.BillingStatus), l.CreatedAt, l.Corrects, l.Reason, d.streamRID); err != nil {
			return fmt.Errorf("write usage log: %w", err)
		}
	}
	return nil
}

// deltaUsage is how the logs change their meters' period totals.
func deltaUsage(logs []*deltaLog) []alerts.Usage {
	out := make([]alerts.Usage, 0, 2*len(logs))
	for _, d := range logs {
		out = append(out,
			alerts.Usage{Meter: alerts.MeterInput, PeriodStart: d.period, Included: d.allowance.InputTokens, Before: d.total.InputTokens, After: d.total.InputTokens + d.log.InputTokens},
			alerts.Usage{Meter: alerts.MeterOutput, PeriodStart: d.period, Included: d.allowance.OutputTokens, Before: d.total.OutputTokens, After: d.total.OutputTokens + d.log.OutputTokens})
	}
	return out
}

// withCorrections adds to a usage log (not a correction) its corrections
// and its corrected totals.
func (s *Service) withCorrections(ctx context.Context, l *overage.UsageLog) error {
	if l.Corrects != nil {
		return nil
	}
	rows, err := s.pool.Query(ctx, `SELECT `+logColumns+` FROM usage_logs WHERE corrects = $1 ORDER BY id`, l.ID)
	if err != nil {
		return fmt.Errorf("read corrections of %s: %w", l.ID, err)
	}
	cs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (overage.UsageLog, error) {
		c, err := scanLog(row)
		if err != nil {
			return overage.UsageLog{}, err
		}
		return *c, nil
	})
	if err != nil {
		return fmt.Errorf("read corrections of %s: %w", l.ID, err)
	}
	tot := overage.Overage{InputTokens: l.InputTokens, OutputTokens: l.OutputTokens}
	for _, c := range cs {
		tot.InputTokens += c.InputTokens
		tot.OutputTokens += c.OutputTokens
	}
	l.Corrections, l.CorrectedTotals = cs, &tot
	return nil
}

var knownCorrectionFields = map[string]bool{"input_tokens": true, "output_tokens": true, "reason": true}

// maxReasonLen bounds a correction's reason, which operators read.
const maxReasonLen = 1000

// parseCorrection decodes and validates a correction body.
func parseCorrection(body []byte) (in, out int64, reason string, err error) {
	raw, err := decodeObject(body, "the body must be a JSON object")
	if err != nil {
		return 0, 0, "", err
	}
	if err := refuseUnknown(raw, func(k string) bool { return knownCorrectionFields[k] }); err != nil {
		return 0, 0, "", err
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
	if v, ok := raw["reason"]; !ok || string(v) == "null" {
		fields = append(fields, overage.FieldError{Field: "reason", Detail: "is required"})
	} else if err := json.Unmarshal(v, &reason); err != nil {
		fields = append(fields, overage.FieldError{Field: "reason", Detail: "must be a string"})
	} else if strings.TrimSpace(reason) == "" || len(reason) > maxReasonLen || strings.ContainsRune(reason, 0) {
		fields = append(fields, overage.FieldError{Field: "reason", Detail: fmt.Sprintf("must be 1 to %d characters, not blank, without NUL", maxReasonLen)})
	}
	if len(fields) > 0 {
		return 0, 0, "", overage.Invalid(fields, "the correction is invalid: %s", describe(fields))
	}
	return in, out, reason, nil
}

func (h *Handler) createCorrection(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, h.correct)
}

// correct runs the checks in ingest's order: authenticate (the owning
// tenant's key or ADMIN_TOKEN), validate, fingerprint, then the key.
func (h *Handler) correct(r *http.Request) (*Outcome, error) {
	var tenantID *uuid.UUID
	if !httpx.IsAdmin(r, h.adminToken) {
		id, err := h.tenant(r)
		if err != nil {
			return nil, err
		}
		tenantID = &id
	}
	key, body, err := readKeyAndBody(r, maxBodyBytes)
	if err != nil {
		return nil, err
	}
	logID, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		return nil, overage.NotFound("usage log %q not found", chi.URLParam(r, "id"))
	}
	in, out, reason, err := parseCorrection(body)
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
	return h.svc.Correct(r.Context(), CorrectParams{TenantID: tenantID, UsageLogID: logID, Key: key, Fingerprint: fp,
		InputTokens: in, OutputTokens: out, Reason: reason})
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
