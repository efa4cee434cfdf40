package finance

import (
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/httpx"
)

// Handler serves the finance endpoints.
type Handler struct {
	db     DB
	admin  [sha256.Size]byte
	open   bool // an admin token is configured
	logger *slog.Logger
}

// HandlerConfig wires a Handler.
type HandlerConfig struct {
	DB DB
	// AdminToken is the bearer token of the finance API (ADMIN_TOKEN).
	// Empty refuses every request.
	AdminToken string
	Logger     *slog.Logger
}

// NewHandler returns the finance endpoints.
func NewHandler(cfg HandlerConfig) *Handler {
	h := &Handler{db: cfg.DB, logger: cfg.Logger, open: cfg.AdminToken != ""}
	if h.open {
		h.admin = sha256.Sum256([]byte(cfg.AdminToken))
	}
	if h.logger == nil {
		h.logger = slog.New(slog.DiscardHandler)
	}
	return h
}

// Routes mounts GET /v1/billing/status on r.
func (h *Handler) Routes(r chi.Router) {
	r.Get("/v1/billing/status", h.status)
}

// status answers the finance report, of one tenant with ?tenant_id=.
func (h *Handler) status(w http.ResponseWriter, r *http.Request) {
	if !h.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="overage-admin"`)
		httpx.Error(w, r, h.logger, overage.Errorf(overage.EUNAUTHORIZED, "unauthorized",
			"send the admin token (ADMIN_TOKEN) as Authorization: Bearer <token>"))
		return
	}
	var tenantID *uuid.UUID
	if q := r.URL.Query(); q.Has("tenant_id") {
		id, err := uuid.Parse(q.Get("tenant_id"))
		if err != nil {
			e := overage.Errorf(overage.EMALFORMED, "malformed-request", "tenant_id must be a tenant id (a UUID)")
			e.Fields = []overage.FieldError{{Field: "tenant_id", Detail: "must be a UUID"}}
			httpx.Error(w, r, h.logger, e)
			return
		}
		tenantID = &id
	}
	rep, err := Status(r.Context(), h.db, tenantID)
	if err != nil {
		httpx.Error(w, r, h.logger, err)
		return
	}
	// Billing data of every tenant: no shared cache may keep it.
	w.Header().Set("Cache-Control", "no-store")
	httpx.JSON(w, http.StatusOK, rep)
}

// authorized reports whether the request carries the admin token. Both
// sides are hashed first, so the comparison takes the same time whatever
// the token's length or content; with no token configured nobody is.
func (h *Handler) authorized(r *http.Request) bool {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return false
	}
	got := sha256.Sum256([]byte(tok))
	match := subtle.ConstantTimeCompare(got[:], h.admin[:]) == 1
	return h.open && match
}
