package meters

import (
	"log/slog"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/dberr"
	"github.com/overage-billing/overage/internal/httpx"
)

// maxBodyBytes bounds a meter request body; the largest real one, a meter
// with a few hundred patterns, is a few KiB.
const maxBodyBytes = 64 << 10

// Handler serves /v1/meters: what the `overage meter` commands do, over
// HTTP, for the holder of ADMIN_TOKEN.
type Handler struct {
	store      *Store
	adminToken string
	logger     *slog.Logger
}

// HandlerConfig wires a Handler.
type HandlerConfig struct {
	Store *Store
	// AdminToken is ADMIN_TOKEN; empty refuses every request.
	AdminToken string
	Logger     *slog.Logger
}

// NewHandler returns the meter endpoints.
func NewHandler(cfg HandlerConfig) *Handler {
	h := &Handler{store: cfg.Store, adminToken: cfg.AdminToken, logger: cfg.Logger}
	if h.logger == nil {
		h.logger = slog.New(slog.DiscardHandler)
	}
	return h
}

// Routes mounts the meter endpoints on r.
func (h *Handler) Routes(r chi.Router) {
	r.Route("/v1/meters", func(r chi.Router) {
		r.Use(httpx.AdminOnly(h.adminToken, h.logger))
		r.Post("/", h.create)
		r.Get("/", h.list)
		r.Delete("/{key}", h.archive)
	})
}

// List is the JSON of GET /v1/meters and `overage meter list --json`.
type List struct {
	Meters []overage.Meter `json:"meters"`
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request) {
	var p CreateParams
	if err := decode(r, &p); err != nil {
		h.fail(w, r, err)
		return
	}
	m, err := h.store.Create(r.Context(), p)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.logger.InfoContext(r.Context(), "meter created", "meter", m.Key, "event_name", m.EventName,
		"token_type", m.TokenType, "models", m.Models)
	httpx.JSON(w, http.StatusCreated, m)
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	ms, err := h.store.List(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.JSON(w, http.StatusOK, List{Meters: ms})
}

func (h *Handler) archive(w http.ResponseWriter, r *http.Request) {
	key := chi.URLParam(r, "key")
	m, err := h.store.Archive(r.Context(), key)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.logger.InfoContext(r.Context(), "meter archived", "meter", m.Key, "archived_at", m.ArchivedAt)
	httpx.JSON(w, http.StatusOK, m)
}

// fail answers err; an unreachable database is 503, nothing changed.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	httpx.Error(w, r, h.logger, dberr.Classify(err, "the database is unavailable; nothing was changed, retry later"))
}

// decode reads the body (see httpx.DecodeJSON).
func decode(r *http.Request, v any) error { return httpx.DecodeJSON(r, v, maxBodyBytes) }
