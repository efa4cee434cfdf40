package ingest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/httpx"
	"github.com/overage-billing/overage/metrics"
)

// Authenticator resolves a tenant API key to who it speaks for.
type Authenticator interface {
	Authenticate(ctx context.Context, apiKey string) (overage.Principal, error)
}

// Observer is told the outcome and duration of every usage event request
// (metrics.Ingest implements it).
type Observer interface {
	ObserveIngest(outcome string, d time.Duration)
}

// Handler serves the ingest endpoints.
type Handler struct {
	svc        *Service
	auth       Authenticator
	adminToken string
	logger     *slog.Logger
	now        func() time.Time
	observer   Observer
	limiter    *tenantLimiter
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
	// Observer, optional, records outcomes and latencies.
	Observer Observer
	// TenantMaxInflight is how many requests of one tenant execute at
	// once (TENANT_MAX_INFLIGHT); beyond, 429 tenant-busy. 0 is
	// DefaultTenantMaxInflight.
	TenantMaxInflight int
}

// NewHandler returns the ingest endpoints.
func NewHandler(cfg HandlerConfig) *Handler {
	h := &Handler{svc: cfg.Service, auth: cfg.Auth, adminToken: cfg.AdminToken, logger: cfg.Logger, now: cfg.Now, observer: cfg.Observer,
		limiter: newTenantLimiter(cfg.TenantMaxInflight)}
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
	r.Post("/v1/usage-events/batch", h.createBatch)
	r.Get("/v1/usage-events/{id}", h.get)
	r.Post("/v1/usage-events/{id}/corrections", h.createCorrection)
	r.Get("/v1/usage-events", h.listByRequestID)
	r.Post(litellmPath, h.createLiteLLM)
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, h.record)
}

func (h *Handler) createBatch(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, h.recordBatch)
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, record func(r *http.Request) (*Outcome, error)) {
	start := time.Now()
	out, err := record(r)
	if h.observer != nil {
		defer func() { h.observer.ObserveIngest(outcomeOf(out, err), time.Since(start)) }()
	}
	if err != nil {
		h.logger.DebugContext(r.Context(), "usage event refused", "type", overage.AsError(err).Type)
		httpx.Error(w, r, h.logger, err)
		return
	}
	if out.Kind == OutcomeReplay {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	httpx.Write(w, "application/json", out.Status, out.Body)
	out.release()
}

// record runs the checks in the contract's order: authenticate, validate,
// fingerprint, then the key. Nothing is stored before the key is claimed.
func (h *Handler) record(r *http.Request) (*Outcome, error) {
	in, err := h.read(r, maxBodyBytes)
	if err != nil {
		return nil, err
	}
	ev, err := parseEvent(in.body, h.now())
	if err != nil {
		return nil, err
	}
	if ev.TenantID != nil && *ev.TenantID != in.tenantID {
		return nil, overage.Errorf(overage.EFORBIDDEN, "tenant-mismatch", "tenant_id names a tenant other than the API key's")
	}
	fp, err := fingerprint(r.Method, r.URL.Path, in.body)
	if err != nil {
		return nil, malformed("body", err.Error())
	}
	// A checkpoint is never coalesced; a single event is, when the
	// service coalesces.
	release, err := h.admit(in.tenantID, ev.Stream == nil)
	if err != nil {
		return nil, err
	}
	defer release()
	if ev.Stream != nil {
		return h.svc.Checkpoint(r.Context(), RecordParams{TenantID: in.tenantID, KeyID: in.keyID, Key: in.key, Fingerprint: fp, Event: ev})
	}
	return h.svc.Record(r.Context(), RecordParams{TenantID: in.tenantID, Key: in.key, Fingerprint: fp, Event: ev})
}

// recordBatch is record for a batch: the same order of checks, every event
// validated before anything is claimed or stored.
//
// Its tenant's slot is taken right after authentication: a tenant past
// its limit is refused before its body (up to maxBatchBytes) is read or
// parsed, so a flood costs little more than the key's lookup.
func (h *Handler) recordBatch(r *http.Request) (*Outcome, error) {
	p, err := h.writer(r)
	if err != nil {
		return nil, err
	}
	tenantID := p.TenantID
	release, err := h.admit(tenantID, false)
	if err != nil {
		return nil, err
	}
	defer release()
	key, body, err := readKeyAndBody(r, maxBatchBytes)
	if err != nil {
		return nil, err
	}
	in := &input{tenantID: tenantID, key: key, body: body}
	events, err := parseBatch(in.body, h.now(), in.tenantID)
	if err != nil {
		return nil, err
	}
	fp, err := fingerprint(r.Method, r.URL.Path, in.body)
	if err != nil {
		return nil, malformed("body", err.Error())
	}
	return h.svc.RecordBatch(r.Context(), BatchParams{TenantID: in.tenantID, Key: in.key, Fingerprint: fp, Events: events})
}

// admit takes one of tenant's TENANT_MAX_INFLIGHT slots for a request
// about to execute, a single event (coalesced when the service coalesces)
// or anything else; it returns the slot's release, or 429 tenant-busy.
// It runs after authentication and before the request's transaction: a
// refused request has cost its key's lookup, nothing more in the
// database.
func (h *Handler) admit(tenant uuid.UUID, singleEvent bool) (func(), error) {
	coalesce := 0
	if h.svc.coalesce != nil {
		coalesce = h.svc.coalesce.inFlight
	}
	return h.limiter.admit(tenant, singleEvent && coalesce > 0, coalesce)
}

// input is what every ingest request carries besides its body's meaning.
type input struct {
	tenantID uuid.UUID
	keyID    uuid.UUID
	key      string
	body     []byte
}

// read authenticates the request (refusing a suspended tenant), checks
// its Content-Type and Idempotency-Key, and reads at most limit bytes of
// body.
func (h *Handler) read(r *http.Request, limit int64) (*input, error) {
	p, err := h.writer(r)
	if err != nil {
		return nil, err
	}
	tenantID := p.TenantID
	key, body, err := readKeyAndBody(r, limit)
	if err != nil {
		return nil, err
	}
	return &input{tenantID: tenantID, keyID: p.KeyID, key: key, body: body}, nil
}

// readKeyAndBody checks the Content-Type, parses the Idempotency-Key and
// reads at most limit bytes of body: the part of every keyed request's
// checks that follows authentication.
func readKeyAndBody(r *http.Request, limit int64) (string, []byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return "", nil, malformed("Content-Type", "the Content-Type header must be application/json")
		}
	}
	key, err := parseIdempotencyKey(r.Header)
	if err != nil {
		return "", nil, err
	}
	body, err := readAll(http.MaxBytesReader(nil, r.Body, limit), r.ContentLength, limit)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return "", nil, overage.Errorf(overage.ETOOLARGE, "payload-too-large", "the body is over %d bytes", limit)
		}
		return "", nil, malformed("body", "could not read the request body")
	}
	return key, body, nil
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) {
	var tenantID *uuid.UUID
	if !httpx.IsAdmin(r, h.adminToken) {
		id, err := h.tenant(r)
		if err != nil {
			httpx.Error(w, r, h.logger, err)
			return
		}
		tenantID = &id
		release, err := h.admit(id, false)
		if err != nil {
			httpx.Error(w, r, h.logger, err)
			return
		}
		defer release()
	}
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		httpx.Error(w, r, h.logger, overage.NotFound("usage log %q not found", chi.URLParam(r, "id")))
		return
	}
	l, err := h.svc.Get(r.Context(), id, tenantID)
	if err != nil {
		httpx.Error(w, r, h.logger, err)
		return
	}
	httpx.JSON(w, http.StatusOK, l)
}

// tenant authenticates the tenant API key of a request that reads: a
// suspended tenant may still read what it recorded.
func (h *Handler) tenant(r *http.Request) (uuid.UUID, error) {
	p, err := h.principal(r)
	return p.TenantID, err
}

// writer authenticates the tenant API key of a request that records usage
// (events, batches, checkpoints, corrections, LiteLLM payloads). A
// suspended tenant's is refused before anything is read or recorded: its
// Stripe customer is gone, so nothing it sends could be billed. The
// suspension comes with the key's lookup, no query of its own.
func (h *Handler) writer(r *http.Request) (overage.Principal, error) {
	p, err := h.principal(r)
	if err != nil {
		return p, err
	}
	if p.Suspended {
		return overage.Principal{}, errSuspended
	}
	return p, nil
}

var errSuspended = overage.Errorf(overage.EFORBIDDEN, "tenant-suspended",
	"the tenant is suspended (its Stripe customer was deleted): nothing was recorded; an operator lifts the suspension with a customer Stripe knows")

func (h *Handler) principal(r *http.Request) (overage.Principal, error) {
	key, ok := httpx.Bearer(r)
	if !ok {
		return overage.Principal{}, overage.Errorf(overage.EUNAUTHORIZED, "unauthorized", "send the tenant API key as Authorization: Bearer <key>")
	}
	p, err := h.auth.Authenticate(r.Context(), key)
	if err != nil {
		return overage.Principal{}, dbError(err)
	}
	return p, nil
}

// outcomeOf names a request's outcome for metrics.
func outcomeOf(out *Outcome, err error) string {
	if err == nil {
		switch out.Kind {
		case OutcomeReplay:
			return metrics.IngestReplay
		case OutcomeDuplicate:
			return metrics.IngestDuplicate
		}
		return metrics.IngestNew
	}
	e := overage.AsError(err)
	switch {
	case e.Type == "idempotency-key-reused":
		return metrics.IngestKeyReuse
	case e.Type == "idempotency-key-in-progress":
		return metrics.IngestInProgress
	case e.Code == overage.EUNAUTHORIZED || e.Code == overage.EFORBIDDEN:
		return metrics.IngestUnauthorized
	case e.Code == overage.EMALFORMED || e.Code == overage.EINVALID || e.Code == overage.ETOOLARGE:
		return metrics.IngestInvalid
	case e.Code == overage.EUNAVAILABLE:
		return metrics.IngestUnavailable
	case e.Code == overage.EBUSY:
		return metrics.IngestBusy
	}
	return metrics.IngestError
}

// readAll is io.ReadAll into a buffer of the declared Content-Length (when
// within limit): io.ReadAll starts at 512 bytes and grows, copying a batch
// body of 100 KB and more some ten times.
func readAll(rd io.Reader, contentLength, limit int64) ([]byte, error) {
	if contentLength <= 0 || contentLength > limit {
		return io.ReadAll(rd)
	}
	// One byte more, so the read that finds EOF needs no new buffer.
	b := make([]byte, 0, contentLength+1)
	for {
		n, err := rd.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}
