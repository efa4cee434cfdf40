package app_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// TestDefaultPoolsFitTheDefaultServer: two serve and two work replicas and
// a CLI command fit in PostgreSQL's default max_connections (100, 3
// reserved) with room left for an operator: a psql and a second command.
func TestDefaultPoolsFitTheDefaultServer(t *testing.T) {
	t.Parallel()
	const operatorRoom = 1 + app.ToolMaxConns
	// A work's pools: the workers', maintenance's, River's and River's listener, which
	// River hijacks out of its pool, and the REPORT_BATCH_DELAY claim.
	if app.WorkMaxConns != app.WorkPoolMaxConns+app.MaintenancePoolMaxConns+app.RiverPoolMaxConns+app.RiverListenerConns+app.BatchDelayConns {
		t.Fatalf("WorkMaxConns %d leaves out a connection of work's", app.WorkMaxConns)
	}
	b := app.ConnectionBudget{MaxConnections: 100, Reserved: 3, Pools: 2*app.ServeMaxConns + 2*app.WorkMaxConns + app.ToolMaxConns}
	if b.Problem() != "" || b.Pools+operatorRoom > b.Usable() {
		t.Fatalf("2 serve (%d) + 2 work (%d) + a tool (%d) = %d of %d usable connections: no room for an operator",
			app.ServeMaxConns, app.WorkMaxConns, app.ToolMaxConns, b.Pools, b.Usable())
	}
}

func TestConnectionBudgetProblem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		b    app.ConnectionBudget
		want string // "" for none, else a phrase of the problem
	}{
		{app.ConnectionBudget{MaxConnections: 100, Reserved: 3, Pools: 20}, ""},
		{app.ConnectionBudget{MaxConnections: 100, Reserved: 3, Pools: 97}, ""},
		{app.ConnectionBudget{MaxConnections: 100, Reserved: 3, Pools: 98}, "more than the 97 the server allows"},
		{app.ConnectionBudget{MaxConnections: 100, Reserved: 3, Others: 60, Pools: 38}, "60 are held by other clients"},
		{app.ConnectionBudget{MaxConnections: 100, Reserved: 3, Others: 60, Pools: 37}, ""},
	} {
		got := tc.b.Problem()
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%+v: problem %q, want %q", tc.b, got, tc.want)
		}
	}
}

// TestWarnConnectionBudget reads the real server's max_connections: pools
// far beyond it are a warning naming the numbers, never a failure.
func TestWarnConnectionBudget(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	b, err := app.ReadConnectionBudget(context.Background(), pool, 1)
	if err != nil {
		t.Fatal(err)
	}
	if b.MaxConnections < 1 || b.Reserved < 0 || b.Others < 0 || b.Usable() < 1 {
		t.Fatalf("budget read from the server: %+v", b)
	}
	var logs bytes.Buffer
	app.WarnConnectionBudget(context.Background(), pool, b.MaxConnections+1, slog.New(slog.NewJSONHandler(&logs, nil)))
	if out := logs.String(); !strings.Contains(out, `"level":"WARN"`) || !strings.Contains(out, "max_connections") || !strings.Contains(out, `"pools_max_conns":`) {
		t.Fatalf("no warning for pools over max_connections: %s", out)
	}
}

// TestServerSettingsProblems: each setting below what ingest at volume
// needs is named with its value, PostgreSQL's defaults (and autovacuum
// off) all four, huge_pages only when off (try may have got them), and a
// server sized for volume none.
func TestServerSettingsProblems(t *testing.T) {
	t.Parallel()
	defaults := app.ServerSettings{SharedBuffers: 128 << 20, MaxWALSize: 1 << 30, CheckpointTimeout: 5 * time.Minute, WALCompression: "off", Autovacuum: false, HugePages: "try"}
	got := strings.Join(defaults.Problems(), "; ")
	if strings.Contains(got, "huge_pages") {
		t.Errorf("problems of the defaults %q name huge_pages, which try may have got", got)
	}
	for _, want := range []string{"shared_buffers is 128 MB", "max_wal_size is 1024 MB", "wal_compression is off", "autovacuum is off"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems of the defaults %q: no %q", got, want)
		}
	}
	sized := app.ServerSettings{SharedBuffers: 6 << 30, MaxWALSize: 16 << 30, CheckpointTimeout: 15 * time.Minute, WALCompression: "lz4", Autovacuum: true, HugePages: "on"}
	if p := sized.Problems(); len(p) != 0 {
		t.Errorf("a server sized for volume has problems: %q", p)
	}
	sized.HugePages = "off"
	if p := sized.Problems(); len(p) != 1 || !strings.Contains(p[0], "huge_pages is off") {
		t.Errorf("huge_pages off: problems %q", p)
	}
}

// TestReadServerSettings reads the real server's settings in bytes and
// warns exactly when they are below the minimums.
func TestReadServerSettings(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	s, err := app.ReadServerSettings(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	// shared_buffers counted in its blocks, not parsed from its text.
	var sb int64
	if err := pool.QueryRow(context.Background(), `SELECT setting::bigint * current_setting('block_size')::bigint FROM pg_settings WHERE name = 'shared_buffers'`).Scan(&sb); err != nil {
		t.Fatal(err)
	}
	if s.SharedBuffers != sb || s.MaxWALSize < 2<<20 || s.CheckpointTimeout < 30*time.Second || s.WALCompression == "" || s.HugePages == "" {
		t.Fatalf("settings read: %+v (shared_buffers %d bytes)", s, sb)
	}
	var logs bytes.Buffer
	app.WarnServerSettings(context.Background(), pool, slog.New(slog.NewJSONHandler(&logs, nil)))
	if warned := strings.Contains(logs.String(), `"level":"WARN"`); warned != (len(s.Problems()) > 0) {
		t.Fatalf("warned %v with problems %q: %s", warned, s.Problems(), logs.String())
	}
}

// A pool of work names its backends, unless DATABASE_URL names them.
func TestOpenPoolAsNamesItsBackendsUnlessTheURLDoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct{ url, want string }{
		{"postgres://u@127.0.0.1:1/db", app.MaintenanceAppName},
		{"postgres://u@127.0.0.1:1/db?application_name=billing-2", "billing-2"},
	} {
		p, err := app.OpenPoolAs(ctx, tc.url, 1, app.MaintenanceAppName)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Config().ConnConfig.RuntimeParams["application_name"]; got != tc.want {
			t.Errorf("%s: application_name %q, want %q", tc.url, got, tc.want)
		}
		p.Close()
	}
}
