package finance

import (
	"log/slog"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/httpx"
	"github.com/overage-billing/overage/internal/page"
)

// Handler serves the finance endpoints.
type Handler struct {
	db         DB
	adminToken string
	logger     *slog.Logger
}

// HandlerConfig wires a Handler.
type HandlerConfig struct {
	DB DB
	// AdminToken is the bearer token of the finance API (ADMIN_TOKEN).
	// Empty refuses every request.
	AdminToken string
	Logger     *slog.Logger
}

// DB is what the finance endpoints read with; *pgxpool.Pool satisfies it.
type DB interface {
	overage.DB
	TxBeginner
}

// NewHandler returns the finance endpoints.
func NewHandler(cfg HandlerConfig) *Handler {
	h := &Handler{db: cfg.DB, adminToken: cfg.AdminToken, logger: cfg.Logger}
	if h.logger == nil {
		h.logger = slog.New(slog.DiscardHandler)
	}
	return h
}

// Routes mounts GET /v1/billing/status on r.
func (h *Handler) Routes(r chi.Router) {
	r.With(httpx.AdminOnly(h.adminToken, h.logger)).Get("/v1/billing/status", h.status)
}

// status answers the finance statement, of one tenant with ?tenant_id=, else
// one page of the tenants (?limit=, ?cursor=) with the totals of all.
func (h *Handler) status(w http.ResponseWriter, r *http.Request) {
	var tenantID *uuid.UUID
	q := r.URL.Query()
	p, err := page.Parse(q)
	if err != nil {
		httpx.Error(w, r, h.logger, err)
		return
	}
	if q.Has("tenant_id") {
		id, err := uuid.Parse(q.Get("tenant_id"))
		if err != nil {
			e := overage.Errorf(overage.EMALFORMED, "malformed-request", "tenant_id must be a tenant id (a UUID)")
			e.Fields = []overage.FieldError{{Field: "tenant_id", Detail: "must be a UUID"}}
			httpx.Error(w, r, h.logger, e)
			return
		}
		tenantID = &id
	}
	var st *Statement
	if tenantID != nil {
		st, err = Status(r.Context(), h.db, tenantID)
	} else {
		st, err = StatusPage(r.Context(), h.db, p)
	}
	if err != nil {
		httpx.Error(w, r, h.logger, err)
		return
	}
	// Billing data of every tenant: no shared cache may keep it.
	w.Header().Set("Cache-Control", "no-store")
	httpx.JSON(w, http.StatusOK, st)
}
