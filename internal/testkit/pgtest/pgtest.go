// Package pgtest gives each test its own migrated PostgreSQL database, so
// tests that commit (workers, HTTP handlers) run in parallel without seeing
// each other's rows.
//
// The server comes from DATABASE_URL; when it is unset and Docker answers,
// testcontainers-go starts one. When neither works the test fails, saying
// how to provide one: a database test never skips silently.
//
// Migrating a database takes a while, so the migrations run once into a
// template database (named after a hash of the migrations, so a changed
// migration makes a new template) and each test clones it with CREATE
// DATABASE ... TEMPLATE, which is a file copy.
//
// The template is kept between runs, to be cloned again, but it is an
// ordinary database (not IS_TEMPLATE, which dropdb refuses): `dropdb
// ovgtmpl_...` removes it at any time, and a run drops the templates of
// other migration sets once they are a day old (templateMaxAge).
package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/internal/testkit/pgcontainer"
	"github.com/overage-billing/overage/migrations"
)

const howToProvide = "set DATABASE_URL (for example DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable) or start a Docker engine so testcontainers-go can run PostgreSQL"

var (
	serverOnce sync.Once
	serverURL  string
	serverErr  error

	templateMu    sync.Mutex
	templateReady = map[string]bool{}
)

// ServerURL returns the URL of the PostgreSQL server the tests use.
func ServerURL(t testing.TB) string {
	t.Helper()
	serverOnce.Do(func() { serverURL, serverErr = resolveServer() })
	if serverErr != nil {
		t.Fatalf("no PostgreSQL for tests: %v; %s", serverErr, howToProvide)
	}
	return serverURL
}

func resolveServer() (string, error) {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The container lives as long as the test process; testcontainers'
	// reaper removes it afterwards.
	u, _, err := pgcontainer.Start(ctx)
	if err != nil {
		return "", fmt.Errorf("DATABASE_URL is unset and %v", err)
	}
	return u, nil
}

// NewDatabase creates a migrated database for t, dropped when t ends, and
// returns its URL (for a child process, say).
func NewDatabase(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	server := ServerURL(t)
	tmpl, err := ensureTemplate(ctx, server)
	if err != nil {
		t.Fatalf("prepare template database: %v", err)
	}
	name := "ovgtest_" + randomHex(8)
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatalf("connect to %s: %v; %s", redact(server), err, howToProvide)
	}
	defer admin.Close(ctx)
	for attempt := 0; ; attempt++ {
		_, err = admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tmpl))
		// A clone fails while another session is connected to the template
		// (a concurrent clone can be); it is brief, so try again.
		if err == nil || attempt == 50 || !strings.Contains(err.Error(), "being accessed by other users") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("create test database: %v", err)
	}
	// The template may be days old: today's and the week ahead's
	// idempotency record partitions, as `overage migrate` makes them.
	if err := ensurePartitions(ctx, withDatabase(server, name)); err != nil {
		t.Fatalf("idempotency record partitions of the test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, server)
		if err != nil {
			t.Logf("drop test database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name)); err != nil {
			t.Logf("drop test database %s: %v", name, err)
		}
	})
	return withDatabase(server, name)
}

// NewEmptyPool returns a pool on a new database with no tables at all (not
// cloned from the migrated template), dropped when t ends: for tests of
// the migrations themselves.
func NewEmptyPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	server := ServerURL(t)
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatalf("connect to %s: %v; %s", redact(server), err, howToProvide)
	}
	defer admin.Close(ctx)
	name := "ovgtest_empty_" + randomHex(8)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create empty test database: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), server)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			c.Close(context.Background())
		}
	})
	pool, err := pgxpool.New(ctx, withDatabase(server, name))
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, UUIDv7SQL); err != nil {
		t.Fatalf("create uuidv7(): %v", err)
	}
	return pool
}

// NewPool returns a pool on a new migrated database, closed when t ends,
// and the database's URL.
func NewPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	dbURL := NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, dbURL
}

// ensureTemplate builds the template database once per server and
// migration set. An advisory lock makes concurrent test binaries (go test
// runs packages in parallel) build it once between them.
func ensureTemplate(ctx context.Context, server string) (string, error) {
	all, err := migrations.All()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, m := range all {
		fmt.Fprintf(h, "%d %s\n%s\n", m.Version, m.Name, m.SQL)
	}
	riverMigrator, err := rivermigrate.New[pgx.Tx](riverpgxv5.New(nil), nil)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "river %d\n", len(riverMigrator.AllVersions()))
	// The template's format: an older pgtest (IS_TEMPLATE, no comment)
	// in another work tree never shares a template with this one.
	fmt.Fprintf(h, "pgtest template v2\n")
	sum := h.Sum(nil)
	name := "ovgtmpl_" + hex.EncodeToString(sum[:6])

	templateMu.Lock()
	defer templateMu.Unlock()
	if templateReady[name] {
		return name, nil
	}
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w; %s", redact(server), err, howToProvide)
	}
	defer admin.Close(ctx)
	lockID := int64(binary.BigEndian.Uint64(sum[:8]))
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock($1)", lockID); err != nil {
		return "", fmt.Errorf("lock template: %w", err)
	}
	defer func() { _, _ = admin.Exec(ctx, "SELECT pg_advisory_unlock($1)", lockID) }()

	dropStaleTemplates(ctx, admin, name)
	// Complete once its comment says when it was built.
	var comment *string
	err = admin.QueryRow(ctx, "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1", name).Scan(&comment)
	if err == nil && comment != nil && strings.HasPrefix(*comment, templateComment) {
		templateReady[name] = true
		return name, nil
	}
	// Missing, or left half-built by a killed run: build it afresh.
	if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name)); err != nil {
		return "", fmt.Errorf("drop stale template: %w", err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s", name)); err != nil {
		return "", fmt.Errorf("create template: %w", err)
	}
	pool, err := pgxpool.New(ctx, withDatabase(server, name))
	if err != nil {
		return "", fmt.Errorf("open template: %w", err)
	}
	_, err = migrations.Migrate(ctx, pool, nil)
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	if err := markTemplate(ctx, admin, name); err != nil {
		return "", err
	}
	templateReady[name] = true
	return name, nil
}

func ensurePartitions(ctx context.Context, dbURL string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := idempotency.EnsurePartitions(ctx, conn); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, UUIDv7SQL)
	return err
}

// UUIDv7SQL creates uuidv7() in a test database (PostgreSQL 18 has its
// own, which takes precedence): the UUIDv7 of now, what ingest mints for a
// usage log. A test seeding usage_logs or usage_reports by SQL uses it for
// their ids, which the tables are partitioned by (a random UUID falls in
// no partition).
const UUIDv7SQL = `CREATE OR REPLACE FUNCTION uuidv7() RETURNS uuid LANGUAGE sql VOLATILE AS $$
	SELECT (lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7'
		|| substr(md5(random()::text), 1, 3) || to_hex(8 + floor(random() * 4)::int) || substr(md5(random()::text), 1, 15))::uuid
$$`

// templateComment starts the comment that marks a template complete; the
// time it was built follows.
const templateComment = "overage test template, built "

// templateMaxAge is how old the template of another migration set may be
// before a run drops it: younger, another work tree's tests may be
// cloning it.
const templateMaxAge = 24 * time.Hour

// markTemplate records the template as complete. It stays an ordinary
// database (not IS_TEMPLATE), which dropdb can remove.
func markTemplate(ctx context.Context, admin *pgx.Conn, name string) error {
	comment := templateComment + time.Now().UTC().Format(time.RFC3339)
	if _, err := admin.Exec(ctx, fmt.Sprintf("COMMENT ON DATABASE %s IS '%s'", name, comment)); err != nil {
		return fmt.Errorf("mark template %s complete: %w", name, err)
	}
	return nil
}

// dropStaleTemplates drops the templates of other migration sets built
// more than templateMaxAge ago. A failure (one in use, say) leaves it for
// the next run. An older pgtest's IS_TEMPLATE ones are left alone (their
// tests may be running); ALTER DATABASE ... IS_TEMPLATE false lets dropdb
// remove one.
func dropStaleTemplates(ctx context.Context, admin *pgx.Conn, keep string) {
	rows, err := admin.Query(ctx, `SELECT datname, coalesce(shobj_description(oid, 'pg_database'), '')
		FROM pg_database WHERE datname LIKE 'ovgtmpl\_%' AND datname <> $1 AND NOT datistemplate`, keep)
	if err != nil {
		return
	}
	type db struct{ name, comment string }
	dbs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (db, error) {
		var d db
		return d, r.Scan(&d.name, &d.comment)
	})
	if err != nil {
		return
	}
	for _, d := range dbs {
		built, err := time.Parse(time.RFC3339, strings.TrimPrefix(d.comment, templateComment))
		if err != nil || time.Since(built) < templateMaxAge {
			continue
		}
		_, _ = admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s", d.name))
	}
}

func withDatabase(server, name string) string {
	u, err := url.Parse(server)
	if err != nil || u.Scheme == "" {
		// A keyword/value connection string: a later dbname wins.
		return server + " dbname=" + name
	}
	u.Path = "/" + name
	return u.String()
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "the DATABASE_URL server"
	}
	return u.Redacted()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
