package ingest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/outbox"
)

// seededKeys is how many idempotency records migrateUnderIngest seeds.
const seededKeys = 100_000

// migrationUnderIngest is one run of the remaining migrations while eight
// clients record single events of one tenant.
type migrationUnderIngest struct {
	res    *migrations.Result
	keys   []string // recorded by the clients, in order
	during int      // recorded while Migrate ran
	record func(key string) (*ingest.Outcome, error)
}

// migrateUnderIngest seeds seededKeys records of a new tenant ("old-1"
// …, expiring in 23 hours), starts the load, runs migrations.Migrate in
// the middle of it, and finishes the load once as many events again were
// recorded after it.
func migrateUnderIngest(t *testing.T, pool *pgxpool.Pool) *migrationUnderIngest {
	t.Helper()
	ctx := context.Background()
	tenant := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id) VALUES ($1, 'alice', 'cus_alice')`, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
		SELECT $1, 'old-' || g, convert_to('old-' || g, 'UTF8'), 202, '\x7b7d', now() + interval '23 hours'
		FROM generate_series(1, $2::int) g`, tenant, seededKeys); err != nil {
		t.Fatal(err)
	}
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc := ingest.NewService(pool, outbox.NewInserter(rc, 5))
	m := &migrationUnderIngest{record: func(key string) (*ingest.Outcome, error) {
		ev := &ingest.Event{UserID: "u", ModelID: "m", InputTokens: 1, OutputTokens: 1, Timestamp: time.Now().UTC().Truncate(time.Microsecond)}
		return svc.Record(ctx, ingest.RecordParams{TenantID: tenant, Key: key, Fingerprint: []byte(key), Event: ev})
	}}
	load := startEventLoad(8, "live", 30*time.Second, m.record)
	waitFor(t, "ingest before the migration", func() bool { return load.recorded(t) >= 300 })
	before := load.recorded(t)
	if m.res, err = migrations.Migrate(ctx, pool, nil); err != nil {
		t.Fatalf("migrate under ingest: %v", err)
	}
	m.during = load.recorded(t) - before
	waitFor(t, "ingest after the migration", func() bool { return load.recorded(t) >= before+m.during+300 })
	m.keys = load.finish(t)
	return m
}

// requireEveryKeyOnceAndReplayed checks that every request recorded has
// exactly one record and one usage log, and that keys from before, during
// and after the migration, and the first and last seeded ones, replay.
func (m *migrationUnderIngest) requireEveryKeyOnceAndReplayed(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	var records, distinct, logs int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT idempotency_key) FROM idempotency_keys WHERE idempotency_key LIKE 'live-%'`).Scan(&records, &distinct); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs`).Scan(&logs); err != nil {
		t.Fatal(err)
	}
	if records != len(m.keys) || distinct != len(m.keys) || logs != len(m.keys) {
		t.Fatalf("%d requests recorded: %d records (%d keys), %d usage logs; want one of each a request", len(m.keys), records, distinct, logs)
	}
	t.Logf("%d events recorded, %d of them while the migration ran", len(m.keys), m.during)
	for _, key := range []string{m.keys[0], m.keys[len(m.keys)/2], m.keys[len(m.keys)-1], "old-1", fmt.Sprintf("old-%d", seededKeys)} {
		out, err := m.record(key)
		if err != nil || out.Kind != ingest.OutcomeReplay {
			t.Fatalf("key %s after the migration: %+v, %v; want its stored answer replayed", key, out, err)
		}
	}
}
