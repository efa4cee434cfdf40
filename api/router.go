// Package api assembles the HTTP API of `overage serve` and holds its
// contract, openapi.yaml. Handlers live with their domain (ingest, ...);
// this package only routes, adds the cross-cutting middleware and answers
// health checks.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/httpx"
)

// Pinger answers whether the database is reachable.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Mounter adds routes to a router.
type Mounter interface {
	Routes(r chi.Router)
}

// Config wires the router.
type Config struct {
	DB       Pinger
	Logger   *slog.Logger
	Handlers []Mounter
	// Metrics, when set, is served at /metrics.
	Metrics http.Handler
	// RiverUI, when set, is mounted at /riverui behind AdminToken.
	RiverUI    http.Handler
	AdminToken string
}

// NewRouter returns the API's handler.
func NewRouter(cfg Config) http.Handler {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := chi.NewRouter()
	r.Use(boundRequestID, middleware.RequestID)
	r.Use(requestLogger(logger))
	r.Use(middleware.Recoverer)
	r.Use(checkQuery(logger))

	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		httpx.JSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Get("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := cfg.DB.Ping(ctx); err != nil {
			logger.WarnContext(r.Context(), "readiness check failed", "err", err)
			httpx.Error(w, r, logger, overage.Errorf(overage.EUNAVAILABLE, "service-unavailable", "the database does not answer"))
			return
		}
		httpx.JSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	for _, h := range cfg.Handlers {
		h.Routes(r)
	}
	if cfg.Metrics != nil {
		r.Method(http.MethodGet, "/metrics", cfg.Metrics)
	}
	if cfg.RiverUI != nil {
		// River UI has no authentication of its own; a browser signs in at
		// /riverui/login with the admin token.
		r.With(httpx.AdminBrowser(cfg.AdminToken, "/riverui", logger)).Mount("/riverui", cfg.RiverUI)
	}
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		httpx.Error(w, r, logger, overage.NotFound("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		// chi sets Allow only in its own 405 handler, and its Match is
		// loose under subrouters: Allow comes from the routes' patterns.
		for _, m := range allowed(r, req.URL.Path) {
			w.Header().Add("Allow", m)
		}
		httpx.Error(w, req, logger, overage.Errorf(overage.EMETHOD, "method-not-allowed", "%s is not allowed on %s", req.Method, req.URL.Path))
	})
	return r
}

// MaxRequestIDLen is the longest client X-Request-Id kept. A longer one,
// or one with a byte outside printable ASCII, is replaced by a generated
// id before anything logs it: a client cannot fill the log with a
// megabyte header or forge log lines with control characters.
const MaxRequestIDLen = 128

// boundRequestID drops a client X-Request-Id that is not 1 to
// MaxRequestIDLen printable ASCII characters, so middleware.RequestID,
// which runs next, generates one instead.
func boundRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get(middleware.RequestIDHeader); id != "" && !validRequestID(id) {
			r.Header.Del(middleware.RequestIDHeader)
		}
		next.ServeHTTP(w, r)
	})
}

func validRequestID(id string) bool {
	if len(id) > MaxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// checkQuery answers 400 to a query parameter holding a NUL byte or bytes
// that are not UTF-8: PostgreSQL cannot store either in text, so the
// request could only fail later, and as a 500.
func checkQuery(logger *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.RawQuery != "" {
				for name, values := range r.URL.Query() {
					for _, v := range append([]string{name}, values...) {
						if strings.IndexByte(v, 0) >= 0 || !utf8.ValidString(v) {
							field := strings.ToValidUTF8(strings.ReplaceAll(name, "\x00", ""), "")
							e := overage.Errorf(overage.EMALFORMED, "malformed-request", "the query parameter %q holds a NUL byte or is not UTF-8", field)
							e.Fields = []overage.FieldError{{Field: field, Detail: "must be UTF-8 text without NUL bytes"}}
							httpx.Error(w, r, logger, e)
							return
						}
					}
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

// requestLogger logs one line per request with its request id. Headers are
// never logged: they carry API keys and tokens.
func requestLogger(logger *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
			next.ServeHTTP(ww, r)
			logger.InfoContext(r.Context(), "http request",
				"request_id", middleware.GetReqID(r.Context()),
				"method", r.Method, "path", r.URL.Path,
				"status", ww.Status(), "bytes", ww.BytesWritten(),
				"duration_ms", float64(time.Since(start).Microseconds())/1000)
		})
	}
}

// allowed lists the methods routed for path, sorted.
func allowed(r chi.Routes, path string) []string {
	var methods []string
	_ = chi.Walk(r, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		if patternMatches(route, path) && !slices.Contains(methods, method) {
			methods = append(methods, method)
		}
		return nil
	})
	slices.Sort(methods)
	return methods
}

// patternMatches reports whether a chi route pattern ("/v1/tenants/{id}",
// "/riverui/*") matches path, a trailing slash aside.
func patternMatches(pattern, path string) bool {
	ps := strings.Split(strings.Trim(pattern, "/"), "/")
	xs := strings.Split(strings.Trim(path, "/"), "/")
	for i, p := range ps {
		if p == "*" {
			return true
		}
		if i >= len(xs) || (xs[i] != p && !(strings.HasPrefix(p, "{") && xs[i] != "")) {
			return false
		}
	}
	return len(ps) == len(xs)
}
