package app

import (
	"context"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

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

// TestServeNamesItsPools: each pool of serve connects under its own
// application_name, so pg_stat_activity tells ingest's backends from the
// finance statement's and the metrics'.
func TestServeNamesItsPools(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	var cfg ServeConfig
	env := map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0"}
	if err := cfg.Read(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(context.Background(), &cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for want, p := range map[string]*pgxpool.Pool{ServeAppName: s.pool, ServeAdminAppName: s.adminPool, ServeMetricsAppName: s.metricsPool} {
		var got string
		if err := p.QueryRow(context.Background(), `SELECT current_setting('application_name')`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("a pool of serve connects as %q, want %q", got, want)
		}
	}
}
