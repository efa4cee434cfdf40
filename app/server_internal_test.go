package app

import (
	"log/slog"
	"testing"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// TestServerTimeouts: serve's http.Server cuts off a client that sends
// its headers or its body slowly, or reads its answer slowly.
func TestServerTimeouts(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	var cfg ServeConfig
	if err := cfg.Read(func(k string) string { return map[string]string{"LISTEN_ADDR": "127.0.0.1:0"}[k] }); err != nil {
		t.Fatal(err)
	}
	s, err := NewServerOn(pool, &cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.ln.Close() })
	h := s.http
	if h.ReadHeaderTimeout <= 0 || h.ReadTimeout <= 0 || h.WriteTimeout <= 0 {
		t.Fatalf("ReadHeaderTimeout %v, ReadTimeout %v, WriteTimeout %v: want each set", h.ReadHeaderTimeout, h.ReadTimeout, h.WriteTimeout)
	}
	// A response under /v1/ gets a write deadline past its request's
	// deadline; the server's WriteTimeout must not cut the finance statement
	// off before it.
	if h.WriteTimeout < AdminRequestTimeout+writeGrace {
		t.Errorf("WriteTimeout %v is shorter than the finance statement's deadline and grace %v", h.WriteTimeout, AdminRequestTimeout+writeGrace)
	}
}
