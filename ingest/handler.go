package ingest

import (
	"context"
	"crypto/subtle"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/httpx"
)

// Authenticator resolves a tenant API key to its tenant.
type Authenticator interface {
	Authenticate(ctx context.Context, apiKey string) (uuid.UUID, error)
}

// Handler serves the ingest endpoints.
type Handler struct {
	svc        *Service
	auth       Authenticator
	adminToken string
	logger     *slog.Logger
	now        func() time.Time
}

// HandlerConfig wires a Handler.
type HandlerConfig struct {
	Service *Service
	Auth    Authenticator
	// AdminToken, when set, may read any tenant's usage logs.
	AdminToken string
	Logger     *slog.Logger
	// Now is the clock for validating timestamps; time.Now when nil.
	Now func() time.Time
}

// NewHandler returns the ingest endpoints.
func NewHandler(cfg HandlerConfig) *Handler {
	h := &Handler{svc: cfg.Service, auth: cfg.Auth, adminToken: cfg.AdminToken, logger: cfg.Logger, now: cfg.Now}
	if h.logger == nil {
		h.logger = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	return h
}

// Routes mounts the endpoints on r.
func (h *Handler) Routes(r chi.Router) {
	r.Post("/v1/usage-events", h.create)
	r.Get("/v1/usage-events/{id}", h.get)
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request) {
	out, err := h.record(r)
	if err != nil {
		h.logger.DebugContext(r.Context(), "usage event refused", "type", overage.AsError(err).Type)
		httpx.Error(w, r, h.logger, err)
		return
	}
	if out.Kind == OutcomeReplay {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	httpx.Write(w, "application/json", out.Status, out.Body)
}

// record runs the checks in the contract's order: authenticate, validate,
// fingerprint, then the key. Nothing is stored before the key is claimed.
func (h *Handler) record(r *http.Request) (*Outcome, error) {
	ctx := r.Context()
	tenantID, err := h.tenant(r)
	if err != nil {
		return nil, err
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return nil, malformed("Content-Type", "must be application/json")
		}
	}
	key, err := parseIdempotencyKey(r.Header)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, overage.Errorf(overage.ETOOLARGE, "payload-too-large", "the body is over %d bytes", maxBodyBytes)
		}
		return nil, malformed("body", "could not read the request body")
	}
	ev, err := parseEvent(body, h.now())
	if err != nil {
		return nil, err
	}
	if ev.TenantID != nil && *ev.TenantID != tenantID {
		return nil, overage.Errorf(overage.EFORBIDDEN, "tenant-mismatch", "tenant_id names a tenant other than the API key's")
	}
	fp, err := fingerprint(r.Method, r.URL.Path, body)
	if err != nil {
		return nil, malformed("body", err.Error())
	}
	return h.svc.Record(ctx, RecordParams{TenantID: tenantID, Key: key, Fingerprint: fp, Event: ev})
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) {
	var tenantID *uuid.UUID
	if !h.isAdmin(r) {
		id, err := h.tenant(r)
		if err != nil {
			httpx.Error(w, r, h.logger, err)
			return
		}
		tenantID = &id
	}
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		httpx.Error(w, r, h.logger, overage.Errorf(overage.ENOTFOUND, "not-found", "usage log %q not found", chi.URLParam(r, "id")))
		return
	}
	l, err := h.svc.Get(r.Context(), id, tenantID)
	if err != nil {
		httpx.Error(w, r, h.logger, err)
		return
	}
	httpx.JSON(w, http.StatusOK, l)
}

// tenant authenticates the tenant API key of a request.
func (h *Handler) tenant(r *http.Request) (uuid.UUID, error) {
	key, ok := bearer(r)
	if !ok {
		return uuid.Nil, overage.Errorf(overage.EUNAUTHORIZED, "unauthorized", "send the tenant API key as Authorization: Bearer <key>")
	}
	id, err := h.auth.Authenticate(r.Context(), key)
	if err != nil {
		return uuid.Nil, dbError(err)
	}
	return id, nil
}

func (h *Handler) isAdmin(r *http.Request) bool {
	tok, ok := bearer(r)
	return ok && h.adminToken != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(h.adminToken)) == 1
}

func bearer(r *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", false
	}
	return strings.TrimSpace(tok), true
}
