package ingest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/outbox"
)

// Two different request_ids of a tenant with one digest, which the usage
// log partitions are unique by: the second is refused with a 409
// request-id-digest-collision naming both, after a bounded number of
// passes, and nothing of its request is recorded; a batch holding two such
// request_ids is refused the same way. A real MD5 collision of two valid
// request_ids is hard to come by, so the database's md5 is shadowed by one
// that ignores case and a leading uuid (a schema ahead of pg_catalog in the
// search_path of the test's connections, under which the partition's
// digest index is made again): "Chat-1" and "chat-1" then collide exactly
// as a real pair would, through the same statements, under either digest
// index, 0061's of the request_id or 0067's of tenant and request_id. A
// request_id sent again is still a duplicate, not a collision. Under
// 0067's, another tenant's "CHAT-1" collides too, and is refused without
// the first tenant's request_id being named.
func TestRequestIDDigestCollisionIsAClearConflict(t *testing.T) {
	t.Parallel()
	for _, shape := range []struct {
		name, index string
	}{
		{"request key", `CREATE UNIQUE INDEX usage_logs_legacy_request_key ON usage_logs_legacy ((collide.md5(tenant_id::text || request_id)::uuid)) WHERE request_id IS NOT NULL`},
		{"request_id digest", `CREATE UNIQUE INDEX usage_logs_legacy_request_digest ON usage_logs_legacy (tenant_id, (collide.md5(request_id)::uuid)) WHERE request_id IS NOT NULL`},
	} {
		t.Run(shape.name, func(t *testing.T) {
			t.Parallel()
			testDigestCollision(t, shape.index, shape.name == "request key")
		})
	}
}

func testDigestCollision(t *testing.T, index string, acrossTenants bool) {
	ctx := context.Background()
	base, _ := pgtest.NewPool(t)
	for _, q := range []string{
		`CREATE SCHEMA collide`,
		`CREATE FUNCTION collide.md5(text) RETURNS text IMMUTABLE STRICT LANGUAGE sql
			AS $$ SELECT pg_catalog.md5(lower(regexp_replace($1, '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', ''))) $$`,
		`DROP INDEX usage_logs_legacy_request_key`,
		index,
	} {
		if _, err := base.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cfg := base.Config().Copy()
	cfg.ConnConfig.RuntimeParams["search_path"] = "collide, pg_catalog, public"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	tenant := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id, included_input_tokens, included_output_tokens)
		VALUES ($1, 'alice', 'cus_alice', 0, 0)`, tenant); err != nil {
		t.Fatal(err)
	}
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc := ingest.NewService(pool, outbox.NewInserter(rc, 5))
	passes := 0
	ingest.SetBeforeWrites(svc, func(context.Context) error { passes++; return nil })
	event := func(rid string) *ingest.Event {
		return &ingest.Event{RequestID: &rid, Timestamp: time.Now().UTC().Truncate(time.Microsecond), UserID: "u", ModelID: "m", InputTokens: 1, OutputTokens: 1}
	}
	record := func(key, rid string) (*ingest.Outcome, error) {
		return svc.Record(ctx, ingest.RecordParams{TenantID: tenant, Key: key, Fingerprint: []byte(key), Event: event(rid)})
	}
	logs := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE tenant_id = $1`, tenant).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if out, err := record("k1", "Chat-1"); err != nil || out.Kind != ingest.OutcomeNew {
		t.Fatalf("the first request_id: %v", describe(out, err))
	}
	collision := func(what string, err error) {
		t.Helper()
		var e *overage.Error
		if !errors.As(err, &e) || e.Code != overage.ECONFLICT || e.Type != ingest.RequestIDDigestCollisionType {
			t.Fatalf("%s: %v; want a conflict of type %s", what, err, ingest.RequestIDDigestCollisionType)
		}
	}
	passes = 0
	_, err = record("k2", "chat-1")
	collision("another request_id of the same digest", err)
	if passes > 3 || logs() != 1 {
		t.Fatalf("the colliding request_id took %d passes and left %d logs; want at most 3, the first log alone", passes, logs())
	}
	_, err = svc.RecordBatch(ctx, ingest.BatchParams{TenantID: tenant, Key: "b1", Fingerprint: []byte("b1"),
		Events: []*ingest.Event{event("fresh"), event("Pair-2"), event("pair-2")}})
	collision("a batch of two request_ids of one digest", err)
	if logs() != 1 {
		t.Fatalf("%d logs after the refused batch; want nothing of it recorded", logs())
	}
	if out, err := record("k3", "Chat-1"); err != nil || out.Kind != ingest.OutcomeDuplicate {
		t.Fatalf("the first request_id sent again: %v; want a duplicate", describe(out, err))
	}
	if !acrossTenants {
		return
	}
	bob := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id, included_input_tokens, included_output_tokens)
		VALUES ($1, 'bob', 'cus_bob', 0, 0)`, bob); err != nil {
		t.Fatal(err)
	}
	rid := "CHAT-1"
	_, err = svc.Record(ctx, ingest.RecordParams{TenantID: bob, Key: "k1", Fingerprint: []byte("k1"), Event: event(rid)})
	collision("another tenant's request_id of the same digest", err)
	var all int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs`).Scan(&all); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(err.Error(), "Chat-1") || all != 1 {
		t.Fatalf("another tenant's colliding request_id: %v, %d logs of the first tenant; want the first tenant's request_id unnamed, its log alone", err, all)
	}
}
