package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/httpx"
	"github.com/overage-billing/overage/internal/page"
	"github.com/overage-billing/overage/usagelog"
)

// Streaming responses. A streamed LLM answer is reported as checkpoints:
// events with a request_id and "stream": {"sequence", "final"} whose
// tokens are the cumulative totals so far. Each checkpoint is its own
// request under its own Idempotency-Key.
//
// One transaction per checkpoint: the key's claim (as for any event), then
// the stream's row in usage_streams locked FOR UPDATE — the referee of two
// checkpoints of one stream racing: the second waits for the first's
// commit and then sees its sequence and totals, so an increase is counted
// once whatever the interleaving. A checkpoint newer than the row's
// sequence records the increase of each total as a usage log (billed like
// any other, its overage computed under the period's lock as corrections
// are); an older or equal one is stale and records nothing. Only the final
// checkpoint may lower a total: the decrease becomes a correction of the
// stream's first log. After the final checkpoint, or once the workers closed
// an idle stream, a newer checkpoint is refused (409 stream-closed).

// Checkpoint is the "stream" member of a checkpoint event.
type Checkpoint struct {
	Sequence int64
	Final    bool
}

// maxSequence keeps sequences far from overflow and inside JSON's exact
// integers.
const maxSequence = 1 << 52

// parseStream validates the "stream" member, reporting through bad.
func parseStream(v json.RawMessage, bad func(field, format string, args ...any)) *Checkpoint {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil || raw == nil {
		bad("stream", `must be an object {"sequence": <integer >= 0>, "final": <boolean>}`)
		return nil
	}
	cp := &Checkpoint{}
	ok := true
	for k := range raw {
		if k != "sequence" && k != "final" {
			bad("stream."+k, "unknown field")
			ok = false
		}
	}
	seq, has := raw["sequence"]
	if n, err := strconv.ParseInt(string(seq), 10, 64); !has || err != nil || n < 0 || n > maxSequence {
		bad("stream.sequence", "is required: an integer from 0 to %d", int64(maxSequence))
		ok = false
	} else {
		cp.Sequence = n
	}
	if f, has := raw["final"]; has {
		if err := json.Unmarshal(f, &cp.Final); err != nil || string(f) == "null" {
			bad("stream.final", "must be true or false")
			ok = false
		}
	}
	if !ok {
		return nil
	}
	return cp
}

// StreamTotals is where a stream stands: its highest recorded sequence and
// the totals that checkpoint carried.
type StreamTotals struct {
	Sequence     int64 `json:"sequence"`
	Final        bool  `json:"final"`
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// Closed: by the final checkpoint, or by the workers after
	// STREAM_IDLE_TIMEOUT without a checkpoint.
	Closed bool `json:"closed"`
}

// checkpointResponse is the JSON of a checkpoint's answer: the usage log it
// recorded (none when stale or when no total rose), the stream's totals,
// and the correction a final checkpoint recorded besides an increase.
type checkpointResponse struct {
	*overage.UsageLog
	Duplicate  *bool             `json:"duplicate,omitempty"`
	Stale      bool              `json:"stale"`
	Stream     StreamTotals      `json:"stream"`
	Correction *overage.UsageLog `json:"correction,omitempty"`
}

// Checkpoint records a checkpoint of a streaming response (p.Event.Stream
// set, p.Event.RequestID set) under its idempotency key.
//
// A unique violation means a plain event took the request_id first, or
// another stream's first checkpoint did; the next pass sees it.
func (s *Service) Checkpoint(ctx context.Context, p RecordParams) (*Outcome, error) {
	return withRetries(func() (*Outcome, error) { return s.checkpointOnce(ctx, p) })
}

type streamRow struct {
	totals   StreamTotals
	firstLog *uuid.UUID
}

const streamSQL = `SELECT sequence, final, input_tokens, output_tokens, closed_at IS NOT NULL, first_usage_log_id
	FROM usage_streams WHERE tenant_id = $1 AND request_id = $2`

func scanStream(row pgx.Row) (*streamRow, error) {
	r := &streamRow{}
	err := row.Scan(&r.totals.Sequence, &r.totals.Final, &r.totals.InputTokens, &r.totals.OutputTokens, &r.totals.Closed, &r.firstLog)
	return r, err
}

func (s *Service) checkpointOnce(ctx context.Context, p RecordParams) (*Outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	return s.executeDelta(ctx, p.TenantID, p.Key, p.Fingerprint, func(ctx context.Context, tx *pipeTx) (*deltaEffect, error) {
		return s.checkpoint(ctx, tx, p)
	})
}

// checkpoint is what a checkpoint records, read and decided in its
// transaction: a duplicate of a plain event, a stale checkpoint, or the
// stream's advance with the logs of its changes.
func (s *Service) checkpoint(ctx context.Context, tx *pipeTx, p RecordParams) (*deltaEffect, error) {
	rid := *p.Event.RequestID
	if eff, err := s.plainDuplicate(ctx, tx, p.TenantID, rid); eff != nil || err != nil {
		return eff, err
	}
	st, err := lockStream(ctx, tx, p.TenantID, rid)
	if err != nil {
		return nil, err
	}
	resp := checkpointResponse{Stream: st.totals}
	cp := p.Event.Stream
	if cp.Sequence <= st.totals.Sequence {
		resp.Stale = true
		return answered(checkpointAnswer(http.StatusOK, resp))
	}
	if err := checkAdvance(st, p.Event, rid); err != nil {
		return nil, err
	}
	cat, err := s.meters.Knowing(ctx, tx, nil)
	if err != nil {
		return nil, err
	}
	logs, first, err := s.streamChanges(ctx, tx, cat, p, st)
	if err != nil {
		return nil, err
	}
	ev := p.Event
	return &deltaEffect{catalog: cat, logs: logs,
		render: func() (*Outcome, error) {
			resp.Stream = StreamTotals{Sequence: cp.Sequence, Final: cp.Final, InputTokens: ev.InputTokens, OutputTokens: ev.OutputTokens, Closed: cp.Final}
			status := http.StatusOK
			if len(logs) > 0 {
				status = http.StatusAccepted
				f := false
				resp.UsageLog, resp.Duplicate = logs[0].log, &f
				if len(logs) > 1 {
					resp.Correction = logs[1].log
				}
			}
			return checkpointAnswer(status, resp)
		},
		after: func(b *pgx.Batch) {
			b.Queue(`UPDATE usage_streams SET sequence = $3, input_tokens = $4, output_tokens = $5, final = $6,
					closed_at = CASE WHEN $6 THEN now() END, closed_by = CASE WHEN $6 THEN 'final' END,
					last_checkpoint_at = now(), first_usage_log_id = $7
				WHERE tenant_id = $1 AND request_id = $2`,
				p.TenantID, rid, cp.Sequence, ev.InputTokens, ev.OutputTokens, cp.Final, first)
		}}, nil
}

// answered is an effect that records nothing and answers out.
func answered(out *Outcome, err error) (*deltaEffect, error) {
	if err != nil {
		return nil, err
	}
	return &deltaEffect{render: func() (*Outcome, error) { return out, nil }}, nil
}

// plainDuplicate answers a checkpoint whose request_id a plain event
// recorded: its duplicate, as a plain event would be (nil: none).
func (s *Service) plainDuplicate(ctx context.Context, tx *pipeTx, tenantID uuid.UUID, rid string) (*deltaEffect, error) {
	l, err := scanLog(tx.QueryRow(ctx, plainLogByRequestIDSQL, tenantID, rid))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read usage log by request_id: %w", err)
	}
	if err := s.present(ctx, tx, l); err != nil {
		return nil, err
	}
	return answered(renderSingle([]result{{log: l, duplicate: true}}))
}

// lockStream locks the stream's row, starting the stream if it has none.
func lockStream(ctx context.Context, tx *pipeTx, tenantID uuid.UUID, rid string) (*streamRow, error) {
	st, err := scanStream(tx.QueryRow(ctx, streamSQL+` FOR UPDATE`, tenantID, rid))
	if errors.Is(err, pgx.ErrNoRows) {
		// Two first checkpoints: the second's insert waits for the first's
		// commit and does nothing; its read then sees the first's row.
		if _, err := tx.Exec(ctx, `INSERT INTO usage_streams (tenant_id, request_id, sequence, input_tokens, output_tokens, last_checkpoint_at)
			VALUES ($1, $2, -1, 0, 0, now()) ON CONFLICT DO NOTHING`, tenantID, rid); err != nil {
			return nil, fmt.Errorf("start stream: %w", err)
		}
		st, err = scanStream(tx.QueryRow(ctx, streamSQL+` FOR UPDATE`, tenantID, rid))
	}
	if err != nil {
		return nil, fmt.Errorf("lock stream: %w", err)
	}
	return st, nil
}

// checkAdvance refuses a newer checkpoint of a closed stream, and one
// that lowers a total without being final.
func checkAdvance(st *streamRow, ev *Event, rid string) error {
	if st.totals.Closed {
		return overage.Errorf(overage.ECONFLICT, "stream-closed",
			"the stream %q is closed (final checkpoint %d, or idle past STREAM_IDLE_TIMEOUT): a newer checkpoint is not recorded", rid, st.totals.Sequence)
	}
	if ev.Stream.Final {
		return nil
	}
	var fields []overage.FieldError
	if ev.InputTokens < st.totals.InputTokens {
		fields = append(fields, overage.FieldError{Field: fieldInputTokens,
			Detail: fmt.Sprintf("is below the stream's total %d: only the final checkpoint may lower a total", st.totals.InputTokens)})
	}
	if ev.OutputTokens < st.totals.OutputTokens {
		fields = append(fields, overage.FieldError{Field: "output_tokens",
			Detail: fmt.Sprintf("is below the stream's total %d: only the final checkpoint may lower a total", st.totals.OutputTokens)})
	}
	if len(fields) > 0 {
		return overage.Invalid(fields, "the checkpoint is invalid: %s", describe(fields))
	}
	return nil
}

// streamChanges are the logs of a checkpoint's changes and the stream's
// first log afterwards. What each meter gets: the cumulative totals (and
// parts) routed, less what the stream's logs put on each meter so far. The
// increases go in a usage log, the decreases (a final checkpoint lowering
// a total, or cached input growing its share) in a correction of the
// first log.
func (s *Service) streamChanges(ctx context.Context, tx *pipeTx, cat *overage.Catalog, p RecordParams, st *streamRow) ([]*deltaLog, *uuid.UUID, error) {
	ev, rid := p.Event, *p.Event.RequestID
	have, err := s.streamMeters(ctx, tx, p.TenantID, rid)
	if err != nil {
		return nil, nil, err
	}
	upLines, downLines := splitDeltas(cat.Route(ev.ModelID).Lines(overage.Amounts(ev.InputTokens, ev.OutputTokens, ev.Parts)), have)
	var logs []*deltaLog
	first := st.firstLog
	if billableTokens(upLines) {
		up, err := s.streamIncrease(ctx, tx, p, dimensions(cat, upLines))
		if err != nil {
			return nil, nil, err
		}
		if first == nil {
			// The stream's first log carries its request_id: a plain event
			// with it is then a duplicate.
			up.log.RequestID, first = &rid, &up.log.ID
		}
		up.lines = upLines
		logs = append(logs, up)
	}
	if billableTokens(downLines) {
		down, err := s.streamDecrease(ctx, tx, p, *st.firstLog, dimensions(cat, downLines))
		if err != nil {
			return nil, nil, err
		}
		down.lines = downLines
		logs = append(logs, down)
	}
	return logs, first, nil
}

// streamIncrease is the usage log of a checkpoint's increases up, in the
// allowance period of the event's timestamp.
func (s *Service) streamIncrease(ctx context.Context, tx *pipeTx, p RecordParams, up overage.Overage) (*deltaLog, error) {
	ev, rid := p.Event, *p.Event.RequestID
	var period time.Time
	var closed bool
	if err := tx.QueryRow(ctx, `SELECT p.start, `+usagelog.PeriodClosedSQL("$1", "p.start", "$3")+`
		FROM (SELECT `+periodOfSQL("$2::timestamptz")+` AS start) p`, p.TenantID, ev.Timestamp, s.closeGrace().Seconds()).Scan(&period, &closed); err != nil {
		return nil, fmt.Errorf("read allowance period: %w", err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, fmt.Errorf("usage log id: %w", err)
	}
	l := &overage.UsageLog{ID: id, TenantID: p.TenantID, Timestamp: ev.Timestamp, UserID: ev.UserID, ModelID: ev.ModelID,
		InputTokens: up.InputTokens, OutputTokens: up.OutputTokens, Kind: overage.KindUsage, StripeTimestamp: usagelog.TimestampUsage}
	if closed {
		l.StripeTimestamp = usagelog.TimestampReported
	}
	return &deltaLog{log: l, period: period.UTC(), streamRID: &rid}, nil
}

// streamDecrease is the correction of the stream's first log by a final
// checkpoint's decreases down (totals above zero were recorded, so the
// first log exists).
func (s *Service) streamDecrease(ctx context.Context, tx *pipeTx, p RecordParams, firstLog uuid.UUID, down overage.Overage) (*deltaLog, error) {
	rid := *p.Event.RequestID
	orig, err := scanLog(tx.QueryRow(ctx, lockLogSQL, firstLog))
	if err != nil {
		return nil, fmt.Errorf("lock the stream's first usage log: %w", err)
	}
	if err := s.present(ctx, tx, orig); err != nil {
		return nil, err
	}
	// The stream's own key lowers what it recorded while the stream is
	// open (STREAM_IDLE_TIMEOUT): part of recording the call, not a refund
	// after the fact, so no period-closed check.
	reason := fmt.Sprintf("final checkpoint %d of stream %s lowered its totals", p.Event.Stream.Sequence, rid)
	c, _, err := correctionOf(ctx, tx, orig, down, reason, p.KeyID.String(), true, s.closeGrace())
	if err != nil {
		return nil, err
	}
	c.streamRID = &rid
	return c, nil
}

// checkpointAnswer renders a checkpoint's answer.
func checkpointAnswer(status int, resp checkpointResponse) (*Outcome, error) {
	body, err := json.Marshal(resp)
	if err != nil {
		return nil, fmt.Errorf("render checkpoint: %w", err)
	}
	out := &Outcome{Status: status, Body: body, Kind: OutcomeNew}
	if resp.UsageLog != nil {
		out.UsageLogID = resp.UsageLog.ID
	} else {
		out.Kind = OutcomeDuplicate
	}
	return out, nil
}

// RequestUsage is the answer to GET /v1/usage-events?request_id=: the logs
// recorded under a request_id (a stream's increases and corrections, or
// the one log of a plain event) and, for a stream, its totals.
type RequestUsage struct {
	RequestID   string             `json:"request_id"`
	UsageEvents []overage.UsageLog `json:"usage_events"`
	Stream      *StreamTotals      `json:"stream"`
	// NextCursor continues usage_events (?cursor=) when more may follow;
	// null on the last page.
	NextCursor *string `json:"next_cursor"`
}

// requestKey is the cursor of a page of a request_id's logs: the last
// one's id (a UUIDv7, so ordered by time).
type requestKey struct {
	ID uuid.UUID `json:"i"`
}

// ByRequestID lists what the tenant recorded under a request_id: one page
// of the logs, oldest first, and the stream's totals on every page.
func (s *Service) ByRequestID(ctx context.Context, tenantID uuid.UUID, rid string, p page.Params) (*RequestUsage, error) {
	var after *uuid.UUID
	if p.HasCursor() {
		var k requestKey
		if err := p.Cursor(&k); err != nil {
			return nil, err
		}
		after = &k.ID
	}
	out := &RequestUsage{RequestID: rid, UsageEvents: []overage.UsageLog{}}
	var logs []overage.UsageLog
	err := s.readTx(ctx, func(tx pgx.Tx) error {
		st, err := scanStream(tx.QueryRow(ctx, streamSQL, tenantID, rid))
		switch {
		case err == nil:
			out.Stream = &st.totals
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("read stream: %w", err)
		}
		rows, err := tx.Query(ctx, byRequestIDSQL, tenantID, rid, after, p.Limit+1)
		if err != nil {
			return fmt.Errorf("read usage logs by request_id: %w", err)
		}
		logs, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (overage.UsageLog, error) {
			l, err := scanLog(row)
			if err != nil {
				return overage.UsageLog{}, err
			}
			return *l, nil
		})
		if err != nil {
			return fmt.Errorf("read usage logs by request_id: %w", err)
		}
		for i := range logs {
			if err := s.present(ctx, tx, &logs[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, dbError(err)
	}
	if len(logs) > p.Limit {
		logs = logs[:p.Limit]
		out.NextCursor = page.Next(true, requestKey{ID: logs[len(logs)-1].ID})
	}
	out.UsageEvents = logs
	if len(logs) == 0 && out.Stream == nil && after == nil {
		return nil, overage.NotFound("nothing was recorded under request_id %q", rid)
	}
	return out, nil
}

// listByRequestID serves GET /v1/usage-events?request_id=: the tenant's
// logs under a request_id and, for a stream, its totals.
func (h *Handler) listByRequestID(w http.ResponseWriter, r *http.Request) {
	tenantID, err := h.tenant(r)
	if err != nil {
		httpx.Error(w, r, h.logger, err)
		return
	}
	rid := r.URL.Query().Get("request_id")
	if rid == "" || len(rid) > maxTextLen {
		httpx.Error(w, r, h.logger, malformed("request_id", fmt.Sprintf("the query parameter request_id is required: 1 to %d characters", maxTextLen)))
		return
	}
	p, err := page.Parse(r.URL.Query())
	if err != nil {
		httpx.Error(w, r, h.logger, err)
		return
	}
	release, err := h.admit(tenantID, false)
	if err != nil {
		httpx.Error(w, r, h.logger, err)
		return
	}
	defer release()
	out, err := h.svc.ByRequestID(r.Context(), tenantID, rid, p)
	if err != nil {
		httpx.Error(w, r, h.logger, err)
		return
	}
	httpx.JSON(w, http.StatusOK, out)
}

// streamMeters sums, per meter, the tokens the stream's logs (its usage
// logs and the corrections its final checkpoints made) put on it.
func (s *Service) streamMeters(ctx context.Context, tx *pipeTx, tenantID uuid.UUID, rid string) (map[string]int64, error) {
	rows, err := tx.Query(ctx, streamLogsSQL, tenantID, rid)
	if err != nil {
		return nil, fmt.Errorf("read the stream's usage logs: %w", err)
	}
	logs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*overage.UsageLog, error) { return scanLog(row) })
	if err != nil {
		return nil, fmt.Errorf("read the stream's usage logs: %w", err)
	}
	if err := s.present(ctx, tx, logs...); err != nil {
		return nil, err
	}
	have := map[string]int64{}
	for _, l := range logs {
		for _, ln := range l.Meters {
			have[ln.Meter] += ln.Tokens
		}
	}
	return have, nil
}

// splitDeltas is target less have (meterDeltas), split by sign: the
// increases and the decreases, each with both default meters first (as
// deltaLog.lines wants) and the other meters that change.
func splitDeltas(target []overage.MeterTokens, have map[string]int64) (up, down []overage.MeterTokens) {
	up = []overage.MeterTokens{{Meter: overage.MeterInput}, {Meter: overage.MeterOutput}}
	down = []overage.MeterTokens{{Meter: overage.MeterInput}, {Meter: overage.MeterOutput}}
	for _, d := range meterDeltas(target, have) {
		side := &up
		if d.Tokens < 0 {
			side = &down
		}
		switch {
		case d.Tokens == 0:
		case d.Meter == overage.MeterInput:
			(*side)[0].Tokens += d.Tokens
		case d.Meter == overage.MeterOutput:
			(*side)[1].Tokens += d.Tokens
		default:
			*side = append(*side, d)
		}
	}
	return up, down
}

// dimensions sums lines per dimension, by their meters' token types.
func dimensions(cat *overage.Catalog, lines []overage.MeterTokens) overage.Overage {
	var o overage.Overage
	for _, ln := range lines {
		m, ok := cat.Meter(ln.Meter)
		if ok && m.TokenType.Dimension() == overage.DimensionOutput {
			o.OutputTokens += ln.Tokens
		} else {
			o.InputTokens += ln.Tokens
		}
	}
	return o
}

// billableTokens reports whether any line holds tokens.
func billableTokens(lines []overage.MeterTokens) bool {
	for _, ln := range lines {
		if ln.Tokens != 0 {
			return true
		}
	}
	return false
}
