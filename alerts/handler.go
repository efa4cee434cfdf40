package alerts

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/dberr"
	"github.com/overage-billing/overage/internal/httpx"
	"github.com/overage-billing/overage/internal/page"
)

// Authenticator resolves a tenant API key to its tenant.
type Authenticator interface {
	Authenticate(ctx context.Context, apiKey string) (overage.Principal, error)
}

// HandlerConfig wires a Handler.
type HandlerConfig struct {
	DB   overage.DB
	Auth Authenticator
	// AdminToken is ADMIN_TOKEN: it may read any tenant's (?tenant_id=).
	AdminToken string
	// EventNames are the Stripe meter event names by meter key.
	EventNames map[string]string
	Logger     *slog.Logger
}

// Handler serves GET /v1/usage and GET /v1/events.
type Handler struct{ cfg HandlerConfig }

// NewHandler returns the usage and events endpoints.
func NewHandler(cfg HandlerConfig) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Handler{cfg: cfg}
}

// Routes mounts the endpoints on r.
func (h *Handler) Routes(r chi.Router) {
	r.Get("/v1/usage", h.usage)
	r.Get("/v1/events", h.events)
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	httpx.Error(w, r, h.cfg.Logger, dberr.Classify(err, "the database is unavailable; retry later"))
}

// tenant is the tenant a request reads: its key's, or ?tenant_id= for the
// administrator.
func (h *Handler) tenant(r *http.Request) (uuid.UUID, error) {
	if h.cfg.AdminToken != "" && httpx.IsAdmin(r, h.cfg.AdminToken) {
		v := r.URL.Query().Get("tenant_id")
		id, err := uuid.Parse(v)
		if err != nil {
			return uuid.Nil, malformed("tenant_id", "is required with ADMIN_TOKEN and must be a tenant id (UUID)")
		}
		return id, nil
	}
	key, ok := httpx.Bearer(r)
	if !ok {
		return uuid.Nil, overage.Errorf(overage.EUNAUTHORIZED, "unauthorized", "send the tenant API key as Authorization: Bearer <key>")
	}
	pr, err := h.cfg.Auth.Authenticate(r.Context(), key)
	if err != nil {
		return uuid.Nil, err
	}
	id := pr.TenantID // a suspended tenant still reads its usage and events
	if v := r.URL.Query().Get("tenant_id"); v != "" && v != id.String() {
		return uuid.Nil, overage.Errorf(overage.EFORBIDDEN, "tenant-mismatch", "tenant_id names a tenant other than the API key's")
	}
	return id, nil
}

func malformed(field, detail string) error {
	e := overage.Errorf(overage.EMALFORMED, "malformed-request", "the query parameter %s %s", field, detail)
	e.Fields = []overage.FieldError{{Field: field, Detail: detail}}
	return e
}

// MeterUsage is one meter's period so far.
type MeterUsage struct {
	Meter     string `json:"meter"`
	EventName string `json:"event_name"`
	Included  int64  `json:"included"`
	Used      int64  `json:"used"`
	Remaining int64  `json:"remaining"`
	Overage   int64  `json:"overage"`
	Billed    int64  `json:"billed"`
	Pending   int64  `json:"pending"`
}

// Period is an allowance period.
type Period struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// PeriodUsage is the answer of GET /v1/usage.
type PeriodUsage struct {
	TenantID uuid.UUID    `json:"tenant_id"`
	Period   Period       `json:"period"`
	Meters   []MeterUsage `json:"meters"`
}

// usageSQL reads a tenant's period so far from counters only: the period
// (the Stripe subscription period covering now, or starting at $2, else
// the calendar month in UTC), then per meter — the defaults, every meter
// the tenant has an allowance on, every meter with usage in the period —
// its allowance, the period's total (allowance_usage for the defaults,
// meter_usage for the others, summed over slots) and its overage by
// billing status (period_counters, summed over slots). A few index probes
// whatever the number of usage logs. No row: no such tenant.
const usageSQL = `
	WITH sub AS (
		SELECT s.current_period_start AS start, s.current_period_end AS fin FROM tenant_subscriptions s
		WHERE s.tenant_id = $1 AND CASE WHEN $2::timestamptz IS NULL
			THEN s.current_period_start <= now() AND now() < s.current_period_end
			ELSE s.current_period_start = $2 END
		ORDER BY s.current_period_start DESC LIMIT 1
	), p AS (
		SELECT coalesce((SELECT start FROM sub), $2::timestamptz, date_trunc('month', now(), 'UTC')) AS start,
		       (SELECT fin FROM sub) AS fin
	), t AS (
		SELECT included_input_tokens, included_output_tokens, included_meters FROM tenants WHERE id = $1
	), used AS (
		SELECT 'input'::text AS meter, sum(a.input_tokens) AS n FROM allowance_usage a, p WHERE a.tenant_id = $1 AND a.period_start = p.start
		UNION ALL
		SELECT 'output', sum(a.output_tokens) FROM allowance_usage a, p WHERE a.tenant_id = $1 AND a.period_start = p.start
		UNION ALL
		SELECT m.meter, sum(m.tokens) FROM meter_usage m, p WHERE m.tenant_id = $1 AND m.period_start = p.start GROUP BY m.meter
	), over AS (
		SELECT c.meter, sum(c.overage_tokens) AS o,
		       sum(c.overage_tokens) FILTER (WHERE c.billing_status = 'billed') AS b,
		       sum(c.overage_tokens) FILTER (WHERE c.billing_status = 'pending') AS q
		FROM period_counters c, p WHERE c.tenant_id = $1 AND c.period_start = p.start GROUP BY c.meter
	), keys AS (
		SELECT 'input'::text AS meter UNION SELECT 'output'
		UNION SELECT k FROM t, jsonb_object_keys(t.included_meters) AS k
		UNION SELECT meter FROM used WHERE n IS NOT NULL
		UNION SELECT meter FROM over
	)
	SELECT p.start, coalesce(p.fin, ((p.start AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC'),
		k.meter, coalesce(me.event_name, ''),
		CASE k.meter WHEN 'input' THEN t.included_input_tokens WHEN 'output' THEN t.included_output_tokens
			ELSE coalesce((t.included_meters ->> k.meter)::bigint, 0) END,
		coalesce(u.n, 0)::bigint, coalesce(o.o, 0)::bigint, coalesce(o.b, 0)::bigint, coalesce(o.q, 0)::bigint
	FROM keys k CROSS JOIN p CROSS JOIN t
	LEFT JOIN used u ON u.meter = k.meter
	LEFT JOIN over o ON o.meter = k.meter
	LEFT JOIN meters me ON me.key = k.meter
	ORDER BY k.meter NOT IN ('input', 'output'), k.meter = 'output', k.meter COLLATE "C"`

// ReadUsage reads a tenant's period so far; periodStart nil is the current
// period. eventNames names the default meters' Stripe meter event names
// (the catalog holds the others').
func ReadUsage(ctx context.Context, db overage.DB, tenantID uuid.UUID, periodStart *time.Time, eventNames map[string]string) (*PeriodUsage, error) {
	rows, err := db.Query(ctx, usageSQL, tenantID, periodStart)
	if err != nil {
		return nil, fmt.Errorf("read usage: %w", err)
	}
	defer rows.Close()
	pu := &PeriodUsage{TenantID: tenantID, Meters: []MeterUsage{}}
	for rows.Next() {
		var m MeterUsage
		if err := rows.Scan(&pu.Period.Start, &pu.Period.End, &m.Meter, &m.EventName, &m.Included, &m.Used, &m.Overage, &m.Billed, &m.Pending); err != nil {
			return nil, fmt.Errorf("read usage: %w", err)
		}
		if m.EventName == "" {
			m.EventName = eventNames[m.Meter]
		}
		m.Remaining = max(0, m.Included-m.Used)
		pu.Meters = append(pu.Meters, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read usage: %w", err)
	}
	if len(pu.Meters) == 0 {
		return nil, overage.NotFound("tenant %s not found", tenantID)
	}
	pu.Period.Start, pu.Period.End = pu.Period.Start.UTC(), pu.Period.End.UTC()
	return pu, nil
}

func (h *Handler) usage(w http.ResponseWriter, r *http.Request) {
	tenant, err := h.tenant(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var ps *time.Time
	if v := r.URL.Query().Get("period_start"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			h.fail(w, r, malformed("period_start", "must be an RFC 3339 time, the start of a period"))
			return
		}
		t = t.UTC()
		ps = &t
	}
	pu, err := ReadUsage(r.Context(), h.cfg.DB, tenant, ps, h.cfg.EventNames)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	httpx.JSON(w, http.StatusOK, pu)
}

// Delivery is an event's delivery status.
type Delivery struct {
	Status        string     `json:"status"`
	Attempts      int        `json:"attempts"`
	DeliveredAt   *time.Time `json:"delivered_at"`
	FailedAt      *time.Time `json:"failed_at"`
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	LastError     *string    `json:"last_error"`
}

// ListedEvent is an event with its delivery status.
type ListedEvent struct {
	Event
	Delivery Delivery `json:"delivery"`
}

// EventList is a page of GET /v1/events, newest first.
type EventList struct {
	Data    []ListedEvent `json:"data"`
	HasMore bool          `json:"has_more"`
	// NextStartingAfter is the ?starting_after= of the next page; null on
	// the last.
	NextStartingAfter *string `json:"next_starting_after"`
}

// Events lists a tenant's events, newest first, after the event
// startingAfter (uuid.Nil: from the newest), at most limit.
func Events(ctx context.Context, db overage.DB, tenantID uuid.UUID, startingAfter uuid.UUID, limit int) (*EventList, error) {
	var after *uuid.UUID
	if startingAfter != uuid.Nil {
		after = &startingAfter
	}
	rows, err := db.Query(ctx, `SELECT id, tenant_id, meter, period_start, threshold_percent, included, used, created_at,
			delivery_status, attempts, delivered_at, failed_at, next_attempt_at, last_error
		FROM alert_events WHERE tenant_id = $1 AND ($2::uuid IS NULL OR id < $2)
		ORDER BY id DESC LIMIT $3`, tenantID, after, limit+1)
	if err != nil {
		return nil, fmt.Errorf("list alert events: %w", err)
	}
	defer rows.Close()
	out := &EventList{Data: []ListedEvent{}}
	for rows.Next() {
		var id uuid.UUID
		var d EventData
		var pct int16
		var created time.Time
		var e ListedEvent
		if err := rows.Scan(&id, &d.TenantID, &d.Meter, &d.PeriodStart, &pct, &d.Included, &d.Used, &created,
			&e.Delivery.Status, &e.Delivery.Attempts, &e.Delivery.DeliveredAt, &e.Delivery.FailedAt, &e.Delivery.NextAttemptAt, &e.Delivery.LastError); err != nil {
			return nil, fmt.Errorf("list alert events: %w", err)
		}
		e.Event = fill(id, d, int(pct), created)
		out.Data = append(out.Data, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list alert events: %w", err)
	}
	if len(out.Data) > limit {
		out.Data, out.HasMore = out.Data[:limit], true
		next := out.Data[limit-1].ID
		out.NextStartingAfter = &next
	}
	return out, nil
}

func (h *Handler) events(w http.ResponseWriter, r *http.Request) {
	tenant, err := h.tenant(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	p, err := page.Parse(q)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var after uuid.UUID
	if v := q.Get("starting_after"); v != "" {
		id, ok := ParseEventID(v)
		if !ok {
			h.fail(w, r, malformed("starting_after", "must be the id of an event (evt_...)"))
			return
		}
		after = id
	}
	l, err := Events(r.Context(), h.cfg.DB, tenant, after, p.Limit)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	httpx.JSON(w, http.StatusOK, l)
}
