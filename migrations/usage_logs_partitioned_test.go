package migrations_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/internal/testkit/billingtest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/usagelog"
)

// seedOldShape writes, on a database migrated to 0053, n usage logs of
// two tenants (pending, billed, not billable; some with meter lines; two
// periods), a report of every tenth, and a review action of the first.
func seedOldShape(t *testing.T, pool *pgxpool.Pool, n int) (tenants [2]uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	for i := range tenants {
		tenants[i] = uuid.New()
		if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id) VALUES ($1, $2, $3)`,
			tenants[i], fmt.Sprintf("t%d", i), fmt.Sprintf("cus_%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status, billed_at, meter_keys, meter_tokens, meter_overage)
		SELECT uuidv7(), CASE WHEN g % 2 = 0 THEN $1::uuid ELSE $2::uuid END, 'r' || g, p + interval '1 hour', 'u', 'm', 10 + g % 7, 3 + g % 5,
			p, g % 7, g % 5, s, CASE WHEN s = 'billed' THEN now() END,
			CASE WHEN g % 5 = 0 THEN '{m_a,m_b}'::text[] END, CASE WHEN g % 5 = 0 THEN '{2,3}'::bigint[] END, CASE WHEN g % 5 = 0 THEN '{1,0}'::bigint[] END
		FROM (SELECT g, date_trunc('month', now() - (g % 2) * interval '32 days', 'UTC') AS p,
				(ARRAY['pending', 'billed', 'not_billable'])[g % 3 + 1] AS s
			FROM generate_series(1, $3::int) g) AS x`, tenants[0], tenants[1], n); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_reports (lead_usage_log_id, dimension, tenant_id, period_start, usage_day, value, ts,
			member_ids, state, first_attempt_at)
		SELECT id, 'input', tenant_id, period_start, ts::date, overage_input_tokens, ts, ARRAY[id], 'accepted', now()
		FROM usage_logs WHERE request_id ~ '0$'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO review_actions (id, usage_log_id, action, reason, actor, previous_status)
		SELECT uuidv7(), id, 'void', 'test', 'tester', billing_status FROM usage_logs WHERE request_id = 'r1'`); err != nil {
		t.Fatal(err)
	}
	return tenants
}

// billingCountersAgainstLogsSQL lists the (tenant, status) groups whose
// billing_counters differ from the sums of the logs.
const billingCountersAgainstLogsSQL = `SELECT coalesce(w.tenant_id, h.tenant_id)::text || '/' || coalesce(w.billing_status, h.billing_status)
	FROM (SELECT tenant_id, billing_status, count(*) AS n, sum(overage_input_tokens) AS i, sum(overage_output_tokens) AS o
		FROM usage_logs GROUP BY 1, 2) AS w
	FULL JOIN (SELECT tenant_id, billing_status, sum(usage_logs) AS n, sum(overage_input_tokens) AS i, sum(overage_output_tokens) AS o
		FROM billing_counters GROUP BY 1, 2 HAVING sum(usage_logs) <> 0) AS h USING (tenant_id, billing_status)
	WHERE w.n IS DISTINCT FROM h.n OR w.i IS DISTINCT FROM h.i OR w.o IS DISTINCT FROM h.o`

func checkCounters(t *testing.T, pool *pgxpool.Pool, step string) {
	t.Helper()
	differ, groups := billingtest.CountersAgainstLines(t, pool)
	if len(differ) != 0 || groups < 6 {
		t.Errorf("%s: %d of %d period_counters groups differ from the logs: %v", step, len(differ), groups, differ)
	}
	rows, err := pool.Query(context.Background(), billingCountersAgainstLogsSQL)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) != 0 {
		t.Errorf("%s: billing_counters differ from the logs in %v", step, bad)
	}
}

// Migrations 0054-0059 on a database of the old shape: usage_logs and
// usage_reports become partitioned tables whose first partitions are the
// old tables, attached without a scan; every log and report is read by its
// key as before; the counters still equal the sums of the logs, and go on
// doing so through writes to the partitioned table (the triggers fire once
// a statement, on the parent); review_actions no longer references the
// logs; months partitions follow.
func TestUsageLogsPartitionedMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewEmptyPool(t)
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 53); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	tenants := seedOldShape(t, pool, n)
	checkCounters(t, pool, "before")
	var ids []uuid.UUID
	rows, err := pool.Query(ctx, `SELECT id FROM usage_logs ORDER BY id`)
	if err == nil {
		ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	}
	if err != nil || len(ids) != n {
		t.Fatalf("%d logs seeded (%v)", len(ids), err)
	}
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 57); err != nil {
		t.Fatal(err)
	}
	// The moves, each as the migrator applies it, PostgreSQL telling what
	// ATTACH did: with the check validated by 0056 and 0057 it reads no row.
	for _, m := range []struct {
		version   int
		partition string
	}{{58, "usage_logs_legacy"}, {59, "usage_reports_legacy"}} {
		implied := fmt.Sprintf(`partition constraint for table "%s" is implied by existing constraints`, m.partition)
		if notices := applyWithNotices(t, pool, m.version); !slices.Contains(notices, implied) {
			t.Errorf("%04d: PostgreSQL did not say %q: ATTACH scanned the table\n%s", m.version, implied, strings.Join(notices, "\n"))
		}
	}
	if _, err := migrations.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	created, err := usagelog.EnsurePartitions(ctx, pool)
	if err != nil || len(created) == 0 {
		t.Fatalf("partitions created after the move: %v (%v)", created, err)
	}

	for _, table := range []string{"usage_logs", "usage_reports"} {
		var kind string
		if err := pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = $1::regclass`, table).Scan(&kind); err != nil || kind != "p" {
			t.Errorf("%s is of kind %q (%v), want partitioned", table, kind, err)
		}
	}
	ps, err := usagelog.Partitions(ctx, pool)
	if err != nil || len(ps) != 1+len(created) || ps[0].Name != "usage_logs_legacy" || ps[0].Reports != "usage_reports_legacy" || ps[0].Lower != nil {
		t.Fatalf("partitions %+v (%v)", ps, err)
	}
	var fks int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND confrelid = 'usage_logs'::regclass`).Scan(&fks); err != nil || fks != 0 {
		t.Errorf("%d foreign keys reference usage_logs (%v); a partition could not be dropped", fks, err)
	}

	// Every log by its id (the key of GET), and every report by its key.
	var found, reports int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM unnest($1::uuid[]) AS k (id) WHERE EXISTS (SELECT FROM usage_logs u WHERE u.id = k.id)`,
		ids).Scan(&found); err != nil || found != n {
		t.Errorf("%d of %d logs found by id after the move (%v)", found, n, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_reports r WHERE EXISTS (
			SELECT FROM usage_reports k WHERE k.lead_usage_log_id = r.lead_usage_log_id AND k.dimension = 'input')`).Scan(&reports); err != nil || reports != n/10 {
		t.Errorf("%d of %d reports found by key (%v)", reports, n/10, err)
	}
	var name string
	if err := pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM usage_logs WHERE id = $1`, ids[n/2]).Scan(&name); err != nil || name != "usage_logs_legacy" {
		t.Errorf("log %s in %q (%v), want the first partition", ids[n/2], name, err)
	}
	checkCounters(t, pool, "after the move")

	// Writes through the partitioned table: a log into the month's
	// partition past the bound and one into the old table, an update of
	// both partitions in one statement, a delete; counted once each.
	past := usagelog.IDFloor(ps[1].Upper.Add(-ps[1].Upper.Sub(*ps[1].Lower) / 2))
	past[15] = 1
	for _, id := range []uuid.UUID{past, uuid.Must(uuid.NewV7())} {
		if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
				period_start, overage_input_tokens, overage_output_tokens, billing_status)
			VALUES ($1, $2, $3, now(), 'u', 'm', 5, 5, date_trunc('month', now(), 'UTC'), 5, 5, 'pending')`, id, tenants[0], id.String()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE usage_logs SET billing_status = 'billed', billed_at = now()
		WHERE billing_status = 'pending' AND tenant_id = $1`, tenants[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM usage_logs WHERE request_id IN ('r3', 'r4')`); err != nil {
		t.Fatal(err)
	}
	checkCounters(t, pool, "after writes to both partitions")
	if err := pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM usage_logs WHERE id = $1`, past).Scan(&name); err != nil || name != ps[1].Name {
		t.Errorf("a log of %v in %q (%v), want %s", ps[1].Lower, name, err, ps[1].Name)
	}
}

// The move refuses ids that are not UUIDv7 minted before its bound (a
// seed script's random UUIDs): 0056 fails saying so, and the table stays
// as it was, unpartitioned, with nothing lost.
func TestUsageLogsPartitionedMigrationRefusesRandomIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewEmptyPool(t)
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 53); err != nil {
		t.Fatal(err)
	}
	seedOldShape(t, pool, 10)
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status)
		SELECT 'f47ac10b-58cc-4372-a567-0e02b2c3d479', tenant_id, ts, 'u', 'm', 1, 1, period_start, 0, 0, 'not_billable' FROM usage_logs LIMIT 1`); err != nil {
		t.Fatal(err)
	}
	_, err := migrations.Migrate(ctx, pool, nil)
	if err == nil || !strings.Contains(err.Error(), "0056") || !strings.Contains(err.Error(), "not UUIDv7") {
		t.Fatalf("migrate with a random id: %v; want 0056 to refuse it", err)
	}
	var kind string
	var logs int
	if err := pool.QueryRow(ctx, `SELECT relkind::text, (SELECT count(*) FROM usage_logs) FROM pg_class WHERE oid = 'usage_logs'::regclass`).Scan(&kind, &logs); err != nil ||
		kind != "r" || logs != 11 {
		t.Errorf("after the refusal usage_logs is of kind %q with %d logs (%v); want the table as it was, 11 logs", kind, logs, err)
	}
}

// applyWithNotices applies migration version as the migrator does, on a
// connection of its own that reports PostgreSQL's DEBUG1 messages, and
// returns them.
func applyWithNotices(t *testing.T, pool *pgxpool.Pool, version int) []string {
	t.Helper()
	ctx := context.Background()
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(all, func(m migrations.Migration) bool { return m.Version == version })
	if i < 0 {
		t.Fatalf("no migration %d", version)
	}
	cfg := pool.Config().ConnConfig.Copy()
	var mu sync.Mutex
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		notices = append(notices, n.Message)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL client_min_messages = debug1`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, all[i].SQL); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO overage_schema_migrations (version, name) VALUES ($1, $2)`, all[i].Version, all[i].Name)
		return err
	})
	if err != nil {
		t.Fatalf("apply %04d: %v", version, err)
	}
	mu.Lock()
	defer mu.Unlock()
	return notices
}
