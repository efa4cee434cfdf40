package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/dberr"
	"github.com/overage-billing/overage/outbox"
)

// KeyTTL is how long an idempotency record is kept and replayed. It is
// advertised in the README and api/openapi.yaml.
const KeyTTL = 24 * time.Hour

// lockTimeout bounds how long one ingest transaction — and so the claim on
// its Idempotency-Key — may live.
const lockTimeout = 10 * time.Second

const lockTimeoutSQL = `SET LOCAL idle_in_transaction_session_timeout = '10s'`

// retryAfterInProgress is the Retry-After of a 409 in progress: an ingest
// transaction takes milliseconds, so one second is ample.
const retryAfterInProgress = time.Second

// Service records usage events.
type Service struct {
	pool   *pgxpool.Pool
	outbox *outbox.Inserter

	// afterLogInsert, set only by tests, runs inside the ingest transaction
	// after the usage log insert; an error aborts the transaction.
	afterLogInsert func(ctx context.Context) error
}

// NewService returns a Service writing to pool and queueing with ob.
func NewService(pool *pgxpool.Pool, ob *outbox.Inserter) *Service {
	return &Service{pool: pool, outbox: ob}
}

// Outcome is the response to send for a usage event.
type Outcome struct {
	Status int
	Body   []byte
	// Kind is "new", "duplicate" or "replay", for logs and metrics.
	Kind string
	// UsageLogID is the usage log the answer is about.
	UsageLogID uuid.UUID
}

// Outcome kinds.
const (
	OutcomeNew       = "new"
	OutcomeDuplicate = "duplicate"
	OutcomeReplay    = "replay"
)

// RecordParams are the inputs of Record, all validated by the caller.
type RecordParams struct {
	TenantID    uuid.UUID
	Key         string
	Fingerprint []byte
	Event       *Event
}

// Record executes a usage event under its idempotency key; see the package
// documentation for the protocol.
func (s *Service) Record(ctx context.Context, p RecordParams) (*Outcome, error) {
	const attempts = 3
	var err error
	for range attempts {
		var out *Outcome
		out, err = s.recordOnce(ctx, p)
		if err == nil {
			return out, nil
		}
		// A unique violation means a concurrent transaction committed the
		// same key or request_id first. This transaction rolled back whole;
		// the next pass reads the winner's row and answers from it.
		if !isRetryable(err) {
			break
		}
	}
	return nil, dbError(err)
}

func (s *Service) recordOnce(ctx context.Context, p RecordParams) (*Outcome, error) {
	// The key stays "in progress" exactly as long as this transaction: bound
	// it here, and in the server too should this process stall.
	ctx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin ingest transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	// One round trip: the lock, then (in a fresh snapshot, taken after the
	// lock) the committed record and any earlier log with this request_id.
	b := &pgx.Batch{}
	b.Queue(lockTimeoutSQL)
	b.Queue(`SELECT pg_try_advisory_xact_lock($1)`, lockKey(p.TenantID, p.Key))
	b.Queue(`SELECT fingerprint, response_status, response_body, usage_log_id, expires_at <= now()
		FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2`, p.TenantID, p.Key)
	if p.Event.RequestID != nil {
		b.Queue(`SELECT `+logColumns+` FROM usage_logs WHERE tenant_id = $1 AND request_id = $2`, p.TenantID, *p.Event.RequestID)
	}
	br := tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("bound the ingest transaction: %w", err)
	}
	var locked bool
	if err := br.QueryRow().Scan(&locked); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("take idempotency lock: %w", err)
	}
	var rec storedResponse
	found := true
	if err := br.QueryRow().Scan(&rec.fingerprint, &rec.status, &rec.body, &rec.usageLogID, &rec.expired); errors.Is(err, pgx.ErrNoRows) {
		found = false
	} else if err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("read idempotency record: %w", err)
	}
	var dup *overage.UsageLog
	if p.Event.RequestID != nil {
		l, err := scanLog(br.QueryRow())
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			_ = br.Close()
			return nil, fmt.Errorf("read usage log by request_id: %w", err)
		default:
			dup = l
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("ingest reads: %w", err)
	}

	if found && !rec.expired {
		return rec.replay(p.Fingerprint)
	}
	if !locked {
		return nil, &overage.Error{
			Code: overage.ECONFLICT, Type: "idempotency-key-in-progress",
			Message:    "a request with this Idempotency-Key is still being processed; retry after the Retry-After delay",
			RetryAfter: retryAfterInProgress,
		}
	}
	if found { // expired: the key starts a new request
		if _, err := tx.Exec(ctx, `DELETE FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2`, p.TenantID, p.Key); err != nil {
			return nil, fmt.Errorf("delete expired idempotency record: %w", err)
		}
	}

	out := &Outcome{}
	if dup != nil {
		// The business event is already recorded under another key: answer
		// with it and bill nothing new. This outcome is deterministic, so it
		// is stored under the new key like any other.
		body, err := json.Marshal(logResponse{UsageLog: dup, Duplicate: true})
		if err != nil {
			return nil, fmt.Errorf("render duplicate: %w", err)
		}
		*out = Outcome{Status: http.StatusOK, Body: body, Kind: OutcomeDuplicate, UsageLogID: dup.ID}
	} else {
		l, err := s.insertLog(ctx, tx, p)
		if err != nil {
			return nil, err
		}
		body, err := json.Marshal(logResponse{UsageLog: l})
		if err != nil {
			return nil, fmt.Errorf("render usage log: %w", err)
		}
		*out = Outcome{Status: http.StatusAccepted, Body: body, Kind: OutcomeNew, UsageLogID: l.ID}
	}

	if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys
		(tenant_id, idempotency_key, fingerprint, response_status, response_body, usage_log_id, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7))`,
		p.TenantID, p.Key, p.Fingerprint, out.Status, out.Body, out.UsageLogID, KeyTTL.Seconds()); err != nil {
		return nil, fmt.Errorf("store idempotency record: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit ingest transaction: %w", err)
	}
	return out, nil
}

// insertLog adds the event to the tenant's running total for its period,
// inserts the usage log with its exact overage, and queues its report.
func (s *Service) insertLog(ctx context.Context, tx pgx.Tx, p RecordParams) (*overage.UsageLog, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return nil, fmt.Errorf("usage log id: %w", err)
	}
	ev := p.Event
	period := periodStart(ev.Timestamp)
	// The upsert's row lock serialises the tenant's concurrent events, so
	// each sees the total including every event committed before it. The
	// overage of a dimension is the part of this event above the allowance:
	// max(0, total - allowance) - max(0, total - tokens - allowance), which
	// splits an event that crosses the allowance exactly.
	//
	// The period is the tenant's Stripe subscription period covering the
	// timestamp when the webhooks told us one (tenant_subscriptions), else
	// $9, the calendar month: chosen in the same statement, no extra round
	// trip.
	row := tx.QueryRow(ctx, `
		WITH period AS (
			SELECT coalesce((
				SELECT s.current_period_start FROM tenant_subscriptions s
				WHERE s.tenant_id = $2 AND s.current_period_start <= $4 AND $4 < s.current_period_end
				ORDER BY s.current_period_start DESC LIMIT 1), $9) AS start
		), total AS (
			INSERT INTO allowance_usage AS a (tenant_id, period_start, input_tokens, output_tokens)
			SELECT $2, period.start, $7, $8 FROM period
			ON CONFLICT (tenant_id, period_start) DO UPDATE
			SET input_tokens = a.input_tokens + EXCLUDED.input_tokens,
			    output_tokens = a.output_tokens + EXCLUDED.output_tokens
			RETURNING a.period_start, a.input_tokens, a.output_tokens
		), over AS (
			SELECT greatest(0, total.input_tokens - t.included_input_tokens)
			         - greatest(0, total.input_tokens - $7 - t.included_input_tokens) AS input,
			       greatest(0, total.output_tokens - t.included_output_tokens)
			         - greatest(0, total.output_tokens - $8 - t.included_output_tokens) AS output,
			       total.period_start
			FROM total, tenants t WHERE t.id = $2
		)
		INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, over.period_start, over.input, over.output,
			CASE WHEN over.input > 0 OR over.output > 0 THEN 'pending' ELSE 'not_billable' END
		FROM over
		RETURNING `+logColumns,
		id, p.TenantID, ev.RequestID, ev.Timestamp, ev.UserID, ev.ModelID, ev.InputTokens, ev.OutputTokens, period)
	l, err := scanLog(row)
	if err != nil {
		return nil, fmt.Errorf("insert usage log: %w", err)
	}
	if s.afterLogInsert != nil {
		if err := s.afterLogInsert(ctx); err != nil {
			return nil, err
		}
	}
	if l.BillingStatus == overage.BillingStatusPending {
		if err := s.outbox.InsertReportsTx(ctx, tx, l.TenantID, []uuid.UUID{l.ID}); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// periodStart is the default allowance period of a usage timestamp: its
// calendar month in UTC. A Stripe subscription period covering the
// timestamp, when the webhooks told us one, takes precedence (insertLog).
func periodStart(ts time.Time) time.Time {
	ts = ts.UTC()
	return time.Date(ts.Year(), ts.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// lockKey maps (tenant, key) to the 64-bit advisory lock id. A collision
// between two keys (odds 2^-64) would only make one answer 409 in
// progress; the primary key still decides what is recorded.
func lockKey(tenant uuid.UUID, key string) int64 {
	h := sha256.New()
	h.Write(tenant[:])
	h.Write([]byte(key))
	return int64(binary.BigEndian.Uint64(h.Sum(nil)))
}

type storedResponse struct {
	fingerprint []byte
	status      int
	body        []byte
	usageLogID  *uuid.UUID
	expired     bool
}

func (r storedResponse) replay(fp []byte) (*Outcome, error) {
	if string(r.fingerprint) != string(fp) {
		return nil, overage.Errorf(overage.ECONFLICT, "idempotency-key-reused",
			"this Idempotency-Key was already used with a different request body; use a new key for a new event")
	}
	out := &Outcome{Status: r.status, Body: r.body, Kind: OutcomeReplay}
	if r.usageLogID != nil {
		out.UsageLogID = *r.usageLogID
	}
	return out, nil
}

// logResponse is the JSON of a usage log in ingest responses.
type logResponse struct {
	*overage.UsageLog
	Duplicate bool `json:"duplicate"`
}

const logColumns = `id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
	overage_input_tokens, overage_output_tokens, billing_status, billed_at, created_at,
	first_attempt_at, billing_message, input_accepted_at, output_accepted_at, input_report_lead, output_report_lead`

func scanLog(row pgx.Row) (*overage.UsageLog, error) {
	l := &overage.UsageLog{}
	var inAt, outAt *time.Time
	var inLead, outLead *uuid.UUID
	if err := row.Scan(&l.ID, &l.TenantID, &l.RequestID, &l.Timestamp, &l.UserID, &l.ModelID, &l.InputTokens, &l.OutputTokens,
		&l.Overage.InputTokens, &l.Overage.OutputTokens, &l.BillingStatus, &l.BilledAt, &l.CreatedAt,
		&l.FirstAttemptAt, &l.BillingMessage, &inAt, &outAt, &inLead, &outLead); err != nil {
		return nil, err
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
	var out []overage.StripeEvent
	for i, d := range overage.Dimensions {
		if v := o.Of(d); v > 0 {
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

// Get returns a usage log the caller may see: the owning tenant's, or any
// for an administrator (tenantID nil).
func (s *Service) Get(ctx context.Context, id uuid.UUID, tenantID *uuid.UUID) (*overage.UsageLog, error) {
	l, err := scanLog(s.pool.QueryRow(ctx, `SELECT `+logColumns+` FROM usage_logs WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && tenantID != nil && l.TenantID != *tenantID) {
		// Another tenant's log is reported as missing, not forbidden, so ids
		// cannot be probed.
		return nil, overage.Errorf(overage.ENOTFOUND, "not-found", "usage log %s not found", id)
	}
	if err != nil {
		return nil, dbError(fmt.Errorf("get usage log: %w", err))
	}
	return l, nil
}

func isRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23505", "40001", "40P01": // unique violation, serialization failure, deadlock
			return true
		}
	}
	return false
}

// dbError marks an unreachable database as EUNAVAILABLE (503).
func dbError(err error) error {
	return dberr.Classify(err, "the usage database is unreachable; nothing was recorded, retry with the same Idempotency-Key")
}
