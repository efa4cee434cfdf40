package tenants

import (
	"log/slog"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/dberr"
	"github.com/overage-billing/overage/internal/httpx"
	"github.com/overage-billing/overage/internal/page"
)

// maxBodyBytes bounds a tenant request body, as ingest bounds its own; the
// largest is a few hundred bytes.
const maxBodyBytes = 64 << 10

// Handler serves /v1/tenants: what the `overage tenant` commands do, over
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

// NewHandler returns the tenant endpoints.
func NewHandler(cfg HandlerConfig) *Handler {
	h := &Handler{store: cfg.Store, adminToken: cfg.AdminToken, logger: cfg.Logger}
	if h.logger == nil {
		h.logger = slog.New(slog.DiscardHandler)
	}
	return h
}

// Routes mounts the tenant endpoints on r.
func (h *Handler) Routes(r chi.Router) {
	r.Route("/v1/tenants", func(r chi.Router) {
		r.Use(httpx.AdminOnly(h.adminToken, h.logger), noStore)
		r.Post("/", h.create)
		r.Get("/", h.list)
		r.Get("/{id}", h.show)
		r.Patch("/{id}", h.update)
		r.Post("/{id}/api-keys", h.addKey)
		r.Delete("/{id}/api-keys/{key_id}", h.revokeKey)
	})
}

// noStore keeps tenants and keys out of every cache: the answers name
// customers, and one carries a new API key.
func noStore(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// createBody is the JSON of POST /v1/tenants.
type createBody struct {
	Name                 string `json:"name"`
	StripeCustomerID     string `json:"stripe_customer_id"`
	IncludedInputTokens  int64  `json:"included_input_tokens"`
	IncludedOutputTokens int64  `json:"included_output_tokens"`
	// Included is the allowance per meter key; included_input_tokens and
	// included_output_tokens are included.input and included.output.
	Included map[string]int64 `json:"included"`
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request) {
	var b createBody
	if err := decode(r, &b); err != nil {
		h.fail(w, r, err)
		return
	}
	c, err := h.store.Create(r.Context(), CreateParams(b))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/tenants/"+c.ID.String())
	httpx.JSON(w, http.StatusCreated, c)
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	p, err := page.Parse(r.URL.Query())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	l, err := h.store.ListPage(r.Context(), p)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.JSON(w, http.StatusOK, l)
}

func (h *Handler) show(w http.ResponseWriter, r *http.Request) {
	id, ok := h.pathID(w, r, "id")
	if !ok {
		return
	}
	d, err := h.store.Show(r.Context(), id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.JSON(w, http.StatusOK, d)
}

func (h *Handler) update(w http.ResponseWriter, r *http.Request) {
	id, ok := h.pathID(w, r, "id")
	if !ok {
		return
	}
	var p UpdateParams
	if err := decode(r, &p); err != nil {
		h.fail(w, r, err)
		return
	}
	d, err := h.store.Update(r.Context(), id, p)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.JSON(w, http.StatusOK, d)
}

func (h *Handler) addKey(w http.ResponseWriter, r *http.Request) {
	id, ok := h.pathID(w, r, "id")
	if !ok {
		return
	}
	k, err := h.store.AddKey(r.Context(), id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.JSON(w, http.StatusCreated, k)
}

func (h *Handler) revokeKey(w http.ResponseWriter, r *http.Request) {
	id, ok := h.pathID(w, r, "id")
	if !ok {
		return
	}
	keyID, ok := h.pathID(w, r, "key_id")
	if !ok {
		return
	}
	k, err := h.store.RevokeKeyByID(r.Context(), id, keyID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpx.JSON(w, http.StatusOK, k)
}

// fail answers err; an unreachable database is 503, nothing changed.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	httpx.Error(w, r, h.logger, dberr.Classify(err, "the database is unavailable; nothing was changed, retry later"))
}

// pathID parses a path parameter as an id; an id that cannot exist names
// nothing, so it is a 404 like an unknown one.
func (h *Handler) pathID(w http.ResponseWriter, r *http.Request, name string) (uuid.UUID, bool) {
	v := chi.URLParam(r, name)
	id, err := uuid.Parse(v)
	if err != nil {
		httpx.Error(w, r, h.logger, overage.NotFound("%s %q is not an id", name, v))
		return uuid.Nil, false
	}
	return id, true
}

// decode reads the body (see httpx.DecodeJSON).
func decode(r *http.Request, v any) error { return httpx.DecodeJSON(r, v, maxBodyBytes) }
