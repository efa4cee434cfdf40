package migrations_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/migrations"
)

func TestMigrateConcurrentlyThenAgain(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewEmptyPool(t)
	ctx := context.Background()
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}

	const runners = 3
	results := make([]*migrations.Result, runners)
	errs := make([]error, runners)
	var wg sync.WaitGroup
	for i := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = migrations.Migrate(ctx, pool, nil)
		}()
	}
	wg.Wait()
	applied := 0
	for i := range runners {
		if errs[i] != nil {
			t.Fatalf("concurrent migrate %d: %v", i, errs[i])
		}
		applied += len(results[i].Applied)
	}
	if applied != len(all) {
		t.Fatalf("concurrent runs applied %d migrations between them, want each of the %d once", applied, len(all))
	}
	again, err := migrations.Migrate(ctx, pool, nil)
	if err != nil || len(again.Applied) != 0 || len(again.RiverVersions) != 0 {
		t.Fatalf("second run: %+v, %v; want nothing applied", again, err)
	}
	for _, table := range []string{"tenants", "api_keys", "usage_logs", "idempotency_keys", "allowance_usage", "river_job"} {
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil || !ok {
			t.Fatalf("table %s missing after migrate (%v)", table, err)
		}
	}
}

func TestMigrationFilesAreNumberedInOrder(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	// Numbers increase from 1; a gap is allowed (a number reserved by a
	// change still in review), a repeat is not (All refuses it).
	for i, m := range all {
		if m.Version < 1 || (i > 0 && m.Version <= all[i-1].Version) {
			t.Fatalf("migration %d is numbered %d: numbers must increase from 1", i, m.Version)
		}
	}
}

// Usage logs carry no foreign key to tenants (0021: its per-row check cost
// a fifth of the ingest's insert); in its place, a tenant can never be
// deleted, so no usage log is ever orphaned.
func TestTenantsAreNeverDeleted(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id)
		VALUES ('00000000-0000-0000-0000-0000000000aa', 'acme', 'cus_acme')`); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`DELETE FROM tenants WHERE id = '00000000-0000-0000-0000-0000000000aa'`,
		`TRUNCATE tenants CASCADE`,
	} {
		_, err := pool.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23001" || !strings.Contains(pgErr.Message, "never deleted") {
			t.Fatalf("%s: got %v, want restrict_violation saying tenants are never deleted", stmt, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM tenants`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("tenants after refused deletes: %d (%v), want 1", n, err)
	}
	var fks int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint
		WHERE conrelid = 'usage_logs'::regclass AND contype = 'f' AND confrelid = 'tenants'::regclass`).Scan(&fks); err != nil || fks != 0 {
		t.Fatalf("foreign keys from usage_logs to tenants: %d (%v), want 0", fks, err)
	}
}
