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

	"github.com/overage-billing/overage"
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
	// The key's scope is the log's tenant, for an administrator too (a
	// log's tenant never changes: read before the transaction).
	var tenantID uuid.UUID
	err := s.pool.QueryRow(ctx, tenantOfLogSQL, p.UsageLogID).Scan(&tenantID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && p.TenantID != nil && *p.TenantID != tenantID) {
		return nil, overage.NotFound("usage log %s not found", p.UsageLogID)
	}
	if err != nil {
		return nil, fmt.Errorf("read usage log: %w", err)
	}
	return s.executeDelta(ctx, tenantID, p.Key, p.Fingerprint, func(ctx context.Context, tx *pipeTx) (*deltaEffect, error) {
		return s.correction(ctx, tx, p)
	})
}

// correction is what a correction records, read and decided in its
// transaction: the original's row lock (FOR UPDATE), the referee of two
// corrections of one log, then the difference to record.
func (s *Service) correction(ctx context.Context, tx *pipeTx, p CorrectParams) (*deltaEffect, error) {
	orig, err := scanLog(tx.QueryRow(ctx, lockLogSQL, p.UsageLogID))
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
	return &deltaEffect{catalog: cat, logs: []*deltaLog{c}, render: func() (*Outcome, error) {
		body, err := json.Marshal(correctionResponse{UsageLog: c.log, StripeTimestamp: basis})
		if err != nil {
			return nil, fmt.Errorf("render correction: %w", err)
		}
		return &Outcome{Status: http.StatusAccepted, Body: body, Kind: OutcomeNew, UsageLogID: c.log.ID}, nil
	}}, nil
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
	if err := tx.QueryRow(ctx, correctedPeriodSQL, orig.TenantID, orig.ID, grace.Seconds()).Scan(&period, &nowPeriod, &closed, &now); err != nil {
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

// deltaLog is a usage log that changes its period's total by its tokens
// (a stream's increase, a correction's difference): its overage is the
// change of the period's overage, computed under the period's lock
// (state.deltaWrites).
type deltaLog struct {
	log       *overage.UsageLog
	period    time.Time
	streamRID *string
	// lines are its tokens per meter, the defaults first (always both):
	// what it adds to each meter's period total.
	lines []overage.MeterTokens
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
	rows, err := q.Query(ctx, correctionsOfSQL, id)
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
func (s *Service) withCorrections(ctx context.Context, q querier, l *overage.UsageLog) error {
	if l.Corrects != nil {
		return nil
	}
	cs, err := s.correctionsOf(ctx, q, l.ID)
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
