package finance_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/finance"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/review"
)

func TestCountersFollowIngestWorkerAndSweepWrites(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	alice := e.Tenant(t, "alice", 0, 0)
	bob := e.Tenant(t, "bob", 0, 0)
	capped := e.Tenant(t, "capped", 1000, 500)
	idle := e.Tenant(t, "idle", 0, 0)

	var a []uuid.UUID
	for range 10 {
		a = append(a, record(t, e.Server, alice, 100, 50))
	}
	var b []uuid.UUID
	for range 6 {
		b = append(b, record(t, e.Server, bob, 200, 0))
	}
	// Within capped's allowance twice (not billable), then across it: 200
	// input and 100 output tokens of overage.
	record(t, e.Server, capped, 400, 100)
	record(t, e.Server, capped, 400, 100)
	crossing := record(t, e.Server, capped, 400, 400)
	requireExact(t, e.Pool)

	for _, id := range a[:4] {
		bill(t, e.Pool, id) // pending -> billed
	}
	park(t, e.Pool, a[4])             // pending -> needs_review
	park(t, e.Pool, a[5])             // pending -> needs_review ...
	bill(t, e.Pool, a[5])             // ... -> billed (Stripe had it after all)
	fail(t, e.Pool, a[6])             // pending -> failed
	park(t, e.Pool, b[0], b[1], b[2]) // the sweep parks several at once
	bill(t, e.Pool, b[3])
	fail(t, e.Pool, b[4])
	bill(t, e.Pool, crossing)
	// The worker's first-attempt stamp changes no status: no counter moves.
	exec(t, e.Pool, `UPDATE usage_logs SET first_attempt_at = now(), updated_at = now() WHERE id = $1`, a[7])

	r := requireExact(t, e.Pool)
	var oldest time.Time
	if err := e.Pool.QueryRow(ctx, `SELECT created_at FROM usage_logs WHERE id = $1`, a[7]).Scan(&oldest); err != nil {
		t.Fatal(err)
	}
	got := tenantOf(t, r, alice.ID)
	want := finance.Counters{UsageLogs: 10, Billed: 5, Pending: 3, NeedsReview: 1, Failed: 1,
		OverageInputTokens: 1000, OverageOutputTokens: 500, BilledInputTokens: 500, BilledOutputTokens: 250, OldestPendingAt: &oldest,
		Meters: []finance.MeterCounters{{Meter: "input", OverageTokens: 1000, BilledTokens: 500}, {Meter: "output", OverageTokens: 500, BilledTokens: 250}}}
	if !sameStatement(&finance.Statement{Totals: got.Counters}, &finance.Statement{Totals: want}) {
		t.Fatalf("alice = %s, want %s", mustJSON(t, got.Counters), mustJSON(t, want))
	}
	if c := tenantOf(t, r, capped.ID); c.NotBillable != 2 || c.Billed != 1 || c.BilledInputTokens != 200 || c.BilledOutputTokens != 100 || c.OldestPendingAt != nil {
		t.Fatalf("capped = %s, want 2 not billable and 200/100 tokens billed, nothing pending", mustJSON(t, c.Counters))
	}
	if c := tenantOf(t, r, idle.ID); !zero(c.Counters) || c.Name != "idle" || c.StripeCustomerID != "cus_idle" {
		t.Fatalf("idle tenant = %s, want zeros", mustJSON(t, c))
	}
	if r.Totals.UsageLogs != 19 || r.Totals.NeedsReview != 4 || r.Totals.Failed != 2 || r.Totals.Billed != 7 {
		t.Fatalf("totals = %s", mustJSON(t, r.Totals))
	}

	// An operator deleting logs, then emptying the table, keeps them exact.
	exec(t, e.Pool, `DELETE FROM usage_logs WHERE id = ANY($1)`, []uuid.UUID{a[0], a[4], b[5]})
	requireExact(t, e.Pool)
	exec(t, e.Pool, `TRUNCATE usage_logs CASCADE`) // CASCADE: operator review rows reference logs
	r = requireExact(t, e.Pool)
	if !zero(r.Totals) || len(r.Tenants) != 4 {
		t.Fatalf("after TRUNCATE: %s, want four tenants with zeros", mustJSON(t, r))
	}
}

// Many report workers change the status of logs of one tenant at once,
// the sweep parks batches of them and ingest keeps inserting: every one of
// these transactions upserts the tenant's hot counter rows. They must end
// exact, and no transaction may deadlock (PostgreSQL would abort one with
// 40P01 and the test would see it).
func TestConcurrentStatusChangesOfOneTenantStayExact(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tenant := e.Tenant(t, "busy", 0, 0)
	other := e.Tenant(t, "other", 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const initial, extra, workers = 240, 60, 24
	ids := make([]uuid.UUID, initial)
	var errs []error
	var mu sync.Mutex
	report := func(err error) {
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < initial; i += 8 {
				var err error
				ids[i], err = tryRecord(ctx, e.Server, tenant, 10, 5)
				report(err)
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs[0])
	}

	// Each worker transaction holds its counter rows until it commits, as
	// the real one does while it completes the River job.
	inTx := func(f func(tx pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
			if err := f(tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT pg_sleep(0.002)`)
			return err
		})
	}
	step := func(sql string, args ...any) error {
		return inTx(func(tx pgx.Tx) error { _, err := tx.Exec(ctx, sql, args...); return err })
	}
	work := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				id := ids[i]
				switch i % 6 {
				case 0, 1, 2:
					report(step(markBilledSQL, id))
				case 3:
					report(step(failSQL, id, "Stripe refused it"))
				case 4:
					report(step(beginSQL, []uuid.UUID{id}))
					report(step(parkSQL, []uuid.UUID{id}))
					report(step(markBilledSQL, id))
				}
			}
		}()
	}
	// The sweep: batches of ten logs parked in one statement each.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for start := 5; start < initial; start += 60 {
			var batch []uuid.UUID
			for i := start; i < min(start+60, initial); i += 6 {
				batch = append(batch, ids[i])
			}
			report(step(beginSQL, batch))
			report(step(parkSQL, batch))
		}
	}()
	// Ingest goes on meanwhile, for this tenant and another.
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range extra / 4 {
				_, err := tryRecord(ctx, e.Server, tenant, 10, 5)
				report(err)
			}
			_, err := tryRecord(ctx, e.Server, other, int64(w+1), 0)
			report(err)
		}()
	}
	for i := range initial {
		if i%6 != 5 {
			work <- i
		}
	}
	close(work)
	wg.Wait()
	for _, err := range errs {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			t.Fatalf("deadlock: %v", err)
		}
		t.Fatal(err)
	}

	r := requireExact(t, e.Pool)
	got := tenantOf(t, r, tenant.ID)
	if got.UsageLogs != initial+extra || got.Billed != initial/6*4 || got.Failed != initial/6 ||
		got.NeedsReview != initial/6 || got.Pending != extra || got.BilledInputTokens != int64(initial/6*4*10) {
		t.Fatalf("busy tenant = %s, want %d logs: %d billed, %d failed, %d in review, %d pending",
			mustJSON(t, got.Counters), initial+extra, initial/6*4, initial/6, initial/6, extra)
	}
	if o := tenantOf(t, r, other.ID); o.Pending != 4 || o.OverageInputTokens != 1+2+3+4 {
		t.Fatalf("other tenant = %s", mustJSON(t, o.Counters))
	}
}

func TestStatusOfOneTenantAndUnknownTenant(t *testing.T) {
	t.Parallel()
	e := setup(t)
	alice := e.Tenant(t, "alice", 0, 0)
	bob := e.Tenant(t, "bob", 0, 0)
	bill(t, e.Pool, record(t, e.Server, alice, 7, 3))
	record(t, e.Server, bob, 11, 0)

	r, err := finance.Status(context.Background(), e.Pool, &bob.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Tenants) != 1 || r.Tenants[0].TenantID != bob.ID {
		t.Fatalf("filtered statement = %s, want bob only", mustJSON(t, r))
	}
	if !sameStatement(&finance.Statement{Totals: r.Totals}, &finance.Statement{Totals: r.Tenants[0].Counters}) {
		t.Fatalf("totals %s differ from the one tenant's counters %s", mustJSON(t, r.Totals), mustJSON(t, r.Tenants[0].Counters))
	}
	if r.Totals.Pending != 1 || r.Totals.OverageInputTokens != 11 || r.Totals.Billed != 0 || r.Totals.OldestPendingAt == nil {
		t.Fatalf("bob = %s", mustJSON(t, r.Totals))
	}

	unknown := uuid.New()
	_, err = finance.Status(context.Background(), e.Pool, &unknown)
	var appErr *overage.Error
	if !errors.As(err, &appErr) || appErr.Code != overage.ENOTFOUND || appErr.Type != "not-found" {
		t.Fatalf("unknown tenant: err = %v, want ENOTFOUND not-found", err)
	}
}

func TestTenantsSortedByNameThenIDWithZeros(t *testing.T) {
	t.Parallel()
	e := setup(t)
	g1 := e.Tenant(t, "gamma", 0, 0)
	e.Tenant(t, "beta", 0, 0)
	g2 := e.Tenant(t, "gamma", 0, 0)
	e.Tenant(t, "alpha", 0, 0)
	record(t, e.Server, g2, 5, 5)

	r, err := finance.Status(context.Background(), e.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range r.Tenants {
		names = append(names, s.Name)
	}
	if strings.Join(names, ",") != "alpha,beta,gamma,gamma" {
		t.Fatalf("order = %v", names)
	}
	first, second := g1.ID, g2.ID
	if second.String() < first.String() {
		first, second = second, first
	}
	if r.Tenants[2].TenantID != first || r.Tenants[3].TenantID != second {
		t.Fatalf("tenants of the same name are not ordered by id: %s", mustJSON(t, r.Tenants[2:]))
	}
	if !zero(tenantOf(t, r, g1.ID).Counters) {
		t.Fatalf("a tenant without logs must have zeros: %s", mustJSON(t, tenantOf(t, r, g1.ID)))
	}
}

// RebuildCounters repairs counters that went wrong, and stays exact while
// ingest writes: its lock makes the writes wait for it instead of landing
// between its scan and its commit.
func TestRebuildCountersRepairsAndStaysExactUnderWrites(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	alice := e.Tenant(t, "alice", 0, 0)
	for range 20 {
		record(t, e.Server, alice, 3, 4)
	}
	exec(t, e.Pool, `UPDATE billing_counters SET usage_logs = usage_logs + 1000, overage_input_tokens = 1`)
	exec(t, e.Pool, `INSERT INTO billing_counters VALUES ($1, 'failed', 5, 5, 5)`, uuid.New())
	if r := oracle(t, e.Pool); r.Totals.UsageLogs != 20 {
		t.Fatalf("oracle sees %d logs", r.Totals.UsageLogs)
	}
	if r, _ := finance.Status(ctx, e.Pool, nil); r.Totals.UsageLogs == 20 {
		t.Fatal("the corruption did not show; the test proves nothing")
	}

	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if _, err := tryRecord(ctx, e.Server, alice, 1, 1); err != nil {
					errs <- err
				}
			}
		}()
	}
	for range 3 {
		if err := finance.RebuildCounters(ctx, e.Pool); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if r := requireExact(t, e.Pool); r.Totals.UsageLogs != 60 {
		t.Fatalf("after rebuild: %d logs, want 60", r.Totals.UsageLogs)
	}
}

// The migration's backfill counts the logs that exist before it, and no
// write can slip in between the backfill and the trigger: writers wait.
func TestMigrationBackfillsExistingLogsAndBlocksWritesMeanwhile(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	alice := e.Tenant(t, "alice", 0, 0)
	bob := e.Tenant(t, "bob", 0, 0)
	// Back to the schema before 0002: no counters, no triggers (the
	// per-statement ones of 0007 and 0020 included).
	exec(t, e.Pool, `DROP FUNCTION billing_counters_truncate, billing_counters_insert_rows,
		billing_counters_update_rows, billing_counters_delete_rows CASCADE`)
	exec(t, e.Pool, `DROP TABLE billing_counters`)
	// And before 0069: every overage stored, none NULL, as 0002's backfill
	// and triggers read them (ingest reads this at its first write).
	exec(t, e.Pool, `ALTER TABLE usage_logs ALTER COLUMN overage_input_tokens SET NOT NULL,
		ALTER COLUMN overage_output_tokens SET NOT NULL`)
	a := record(t, e.Server, alice, 10, 10)
	record(t, e.Server, alice, 20, 0)
	bill(t, e.Pool, a)
	record(t, e.Server, bob, 0, 30)

	var sql string
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		if m.Version == 2 {
			sql = m.SQL
		}
	}
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, sql); err != nil {
		t.Fatalf("migration 0002: %v", err)
	}
	// While the migration's transaction is open, an ingest write waits.
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = tryRecord(wctx, e.Server, bob, 1, 1)
	cancel()
	if err == nil {
		t.Fatal("a usage log was written while the backfill held its lock")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := requireExact(t, e.Pool)
	if r.Totals.UsageLogs != 3 || r.Totals.Billed != 1 || r.Totals.BilledInputTokens != 10 {
		t.Fatalf("after backfill: %s", mustJSON(t, r.Totals))
	}
	// And from now on the triggers keep them.
	fail(t, e.Pool, record(t, e.Server, bob, 5, 5))
	requireExact(t, e.Pool)
}

// The pending index is built CONCURRENTLY (migrations.Migrate waits for
// other migrators without holding a snapshot, and refuses to record a file
// that left an INVALID index), and the result is valid.
func TestPendingIndexMigrationIsConcurrentAndValid(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	var m *migrations.Migration
	for i := range all {
		if strings.Contains(all[i].SQL, "usage_logs_tenant_pending") && strings.Contains(all[i].SQL, "CREATE INDEX") {
			m = &all[i]
		}
	}
	if m == nil {
		t.Fatal("no migration creates usage_logs_tenant_pending")
	}
	code := regexp.MustCompile(`(?m)--.*$`).ReplaceAllString(m.SQL, "")
	// On a table of millions of rows the build must not block writes.
	if !strings.HasPrefix(m.SQL, "-- overage:no-transaction") || !strings.Contains(code, "CONCURRENTLY") {
		t.Fatalf("migration %04d does not build the index CONCURRENTLY", m.Version)
	}
	pool, _ := pgtest.NewPool(t)
	var valid bool
	var def string
	if err := pool.QueryRow(context.Background(), `SELECT indisvalid, pg_get_indexdef(indexrelid) FROM pg_index
		WHERE indexrelid = 'usage_logs_tenant_pending'::regclass`).Scan(&valid, &def); err != nil || !valid {
		t.Fatalf("usage_logs_tenant_pending valid = %v (%v)", valid, err)
	}
	if !strings.Contains(def, "(tenant_id, created_at) WHERE (billing_status = 'pending'::text)") {
		t.Fatalf("index = %s", def)
	}
}

func TestNeedsReviewListsParkedLogs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	alice := e.Tenant(t, "alice", 0, 0)
	bob := e.Tenant(t, "bob", 0, 0)
	a1, a2 := record(t, e.Server, alice, 1, 1), record(t, e.Server, alice, 2, 2)
	b1 := record(t, e.Server, bob, 3, 3)
	record(t, e.Server, bob, 4, 4) // stays pending
	park(t, e.Pool, a1, a2, b1)

	needsReview := []overage.BillingStatus{overage.BillingStatusNeedsReview}
	logs, err := review.List(ctx, e.Pool, review.ListParams{Statuses: needsReview, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []uuid.UUID
	for _, l := range logs {
		got = append(got, l.UsageLogID)
		if !strings.Contains(l.Reason, "idempotency window") || l.FirstAttemptAt == nil {
			t.Fatalf("log in review without its reason: %+v", l)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint([]uuid.UUID{a1, a2, b1}) {
		t.Fatalf("in review = %v, want %v", got, []uuid.UUID{a1, a2, b1})
	}
	if logs, _ := review.List(ctx, e.Pool, review.ListParams{TenantID: &bob.ID, Statuses: needsReview, Limit: 10}); len(logs) != 1 || logs[0].UsageLogID != b1 || logs[0].OverageInputTokens != 3 {
		t.Fatalf("bob in review = %+v", logs)
	}
	if logs, _ := review.List(ctx, e.Pool, review.ListParams{Statuses: needsReview, Limit: 2}); len(logs) != 2 {
		t.Fatalf("limit 2 gave %d", len(logs))
	}
	var sb strings.Builder
	if err := review.WriteTable(&sb, logs); err != nil || !strings.Contains(sb.String(), b1.String()) {
		t.Fatalf("WriteTable = %q, %v", sb.String(), err)
	}
}

// The counter triggers run once per statement over its transition tables
// (migration 0020): a statement that writes many logs of several tenants
// and statuses must move each counter by exactly its rows, no row missed
// and none counted twice, on every kind of write.
func TestMultiRowStatementsKeepCountersExact(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	alice := e.Tenant(t, "alice", 0, 0)
	bob := e.Tenant(t, "bob", 0, 0)
	carol := e.Tenant(t, "carol", 0, 0)
	for range 3 {
		record(t, e.Server, alice, 1, 1)
		record(t, e.Server, bob, 2, 0)
	}
	requireExact(t, e.Pool)

	// One multi-row INSERT of logs of three tenants in two statuses; the
	// insert copies existing logs under new ids and request ids.
	const copyLogs = `INSERT INTO usage_logs
		SELECT (jsonb_populate_record(u, jsonb_build_object('id', uuidv7(), 'request_id', uuidv7()::text))).*
		FROM usage_logs u`
	if n := exec(t, e.Pool, copyLogs); n != 6 {
		t.Fatalf("copied %d logs, want 6", n)
	}
	exec(t, e.Pool, `UPDATE usage_logs SET tenant_id = $1 WHERE id IN (SELECT id FROM usage_logs WHERE tenant_id = $2 LIMIT 2)`, carol.ID, bob.ID)
	requireExact(t, e.Pool)

	// COPY goes through the same insert trigger.
	rows, err := e.Pool.Query(ctx, `SELECT * FROM usage_logs`)
	if err != nil {
		t.Fatal(err)
	}
	cols := rows.FieldDescriptions()
	var names []string
	for _, c := range cols {
		names = append(names, c.Name)
	}
	var data [][]any
	for rows.Next() {
		v, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		for i, n := range names {
			switch n {
			case "id":
				v[i] = uuid.Must(uuid.NewV7()) // a usage log id: UUIDv7, in a partition
			case "request_id":
				v[i] = uuid.NewString()
			}
		}
		data = append(data, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := e.Pool.CopyFrom(ctx, pgx.Identifier{"usage_logs"}, names, pgx.CopyFromRows(data)); err != nil || n != 12 {
		t.Fatalf("COPY: %d rows, %v", n, err)
	}
	r := requireExact(t, e.Pool)
	if r.Totals.UsageLogs != 24 || r.Totals.Pending != 24 {
		t.Fatalf("after INSERT and COPY: %s, want 24 pending logs", mustJSON(t, r.Totals))
	}

	// One UPDATE moving logs of all three tenants between statuses: some
	// pending to billed, some to failed, some to needs_review, and the
	// overage of some changed without a status change.
	n := exec(t, e.Pool, `UPDATE usage_logs SET
			billing_status = (ARRAY['billed', 'failed', 'needs_review', 'pending'])[1 + k % 4],
			input_tokens = input_tokens + CASE WHEN k % 4 = 3 THEN 10 ELSE 0 END,
			overage_input_tokens = overage_input_tokens + CASE WHEN k % 4 = 3 THEN 10 ELSE 0 END
		FROM (SELECT id, row_number() OVER (ORDER BY id) AS k FROM usage_logs) o
		WHERE usage_logs.id = o.id`)
	if n != 24 {
		t.Fatalf("updated %d logs, want 24", n)
	}
	r = requireExact(t, e.Pool)
	if r.Totals.Billed != 6 || r.Totals.Failed != 6 || r.Totals.NeedsReview != 6 || r.Totals.Pending != 6 {
		t.Fatalf("after the status update: %s, want 6 of each", mustJSON(t, r.Totals))
	}
	// Statuses swapped within one statement (billed <-> failed): the
	// counts per status stay, and must.
	exec(t, e.Pool, `UPDATE usage_logs SET billing_status = CASE billing_status WHEN 'billed' THEN 'failed' ELSE 'billed' END
		WHERE billing_status IN ('billed', 'failed')`)
	requireExact(t, e.Pool)
	// An UPDATE of no counted column moves nothing, and an UPDATE of no
	// row neither.
	before := counterRows(t, e.Pool)
	exec(t, e.Pool, `UPDATE usage_logs SET first_attempt_at = now(), updated_at = now()`)
	exec(t, e.Pool, `UPDATE usage_logs SET billing_status = 'billed' WHERE false`)
	if after := counterRows(t, e.Pool); after != before {
		t.Fatalf("an UPDATE that changed no counted column wrote counter rows: %s, then %s", before, after)
	}

	// One DELETE of logs of several tenants and statuses, inside a
	// transaction that also writes from a leased slot, as ingest does.
	err = pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('overage.slot', '7', true)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM usage_logs WHERE billing_status <> 'pending' AND coalesce(overage_input_tokens, input_tokens) < 2`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE usage_logs SET billing_status = 'billed' WHERE billing_status = 'pending'`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	r = requireExact(t, e.Pool)
	if r.Totals.Pending != 0 || r.Totals.UsageLogs >= 24 {
		t.Fatalf("after DELETE: %s", mustJSON(t, r.Totals))
	}
	var slot7 int
	if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM billing_counters WHERE slot = 7`).Scan(&slot7); err != nil || slot7 == 0 {
		t.Fatalf("the transaction's slot got %d counter rows (%v): the triggers ignored overage.slot", slot7, err)
	}
}

// counterRows is billing_counters as text, with the versions of its rows:
// it changes when any counter row is written, even to the same value.
func counterRows(t testing.TB, db *pgxpool.Pool) string {
	t.Helper()
	var s string
	if err := db.QueryRow(context.Background(), `SELECT coalesce(string_agg(format('%s/%s/%s=%s,%s,%s@%s', tenant_id, billing_status, slot,
			usage_logs, overage_input_tokens, overage_output_tokens, xmin), ' ' ORDER BY tenant_id, billing_status, slot), '')
		FROM billing_counters`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// Migration 0020 swaps the per-row update and delete triggers for
// per-statement ones on a live table: while its transaction is open,
// writers wait and readers do not, and afterwards the counters follow
// multi-row writes exactly. The database is staged at 0019, the schema
// 0020 ran on (usage_logs became partitioned later, 0058).
func TestMigrationToStatementTriggersBlocksWritesNotReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewEmptyPool(t)
	if _, err := migrations.MigrateUpTo(ctx, pool, nil, 19); err != nil {
		t.Fatal(err)
	}
	tenant := uuid.New()
	exec(t, pool, `INSERT INTO tenants (id, name, stripe_customer_id) VALUES ($1, 'alice', 'cus_alice')`, tenant)
	const insertLog = `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens, period_start,
			overage_input_tokens, overage_output_tokens, billing_status)
		VALUES (uuidv7(), $1, now(), 'u', 'm', $2, $3, date_trunc('month', now(), 'UTC'), $2, $3, 'pending')`
	exec(t, pool, insertLog, tenant, 1, 2)
	exec(t, pool, insertLog, tenant, 3, 4)

	var sql string
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		if m.Version == 20 {
			sql = m.SQL
		}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, sql); err != nil {
		t.Fatalf("migration 0020: %v", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	var n int
	err = pool.QueryRow(rctx, `SELECT count(*) FROM usage_logs`).Scan(&n)
	cancel()
	if err != nil || n != 2 {
		t.Fatalf("a reader of usage_logs during the migration: %d logs, %v", n, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = pool.Exec(wctx, insertLog, tenant, 1, 1)
	cancel()
	if err == nil {
		t.Fatal("a usage log was written while the migration swapped the triggers")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var perRow int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'usage_logs'::regclass
		AND tgname LIKE 'usage_logs_billing_counters_%' AND (tgtype & 1 = 1 OR (tgname <> 'usage_logs_billing_counters_truncate' AND tgoldtable IS NULL AND tgnewtable IS NULL))`).Scan(&perRow); err != nil || perRow != 0 {
		t.Fatalf("%d counter triggers still per row or without transition tables (%v)", perRow, err)
	}
	// Multi-row writes, counted by the statement triggers: both logs to
	// needs_review in one statement, then one deleted.
	exec(t, pool, `UPDATE usage_logs SET billing_status = 'needs_review' WHERE tenant_id = $1`, tenant)
	exec(t, pool, `DELETE FROM usage_logs WHERE id = (SELECT id FROM usage_logs ORDER BY id LIMIT 1)`)
	var logs, review int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(usage_logs), 0)::bigint, coalesce(sum(usage_logs) FILTER (WHERE billing_status = 'needs_review'), 0)::bigint
		FROM billing_counters WHERE tenant_id = $1`, tenant).Scan(&logs, &review); err != nil || logs != 1 || review != 1 {
		t.Fatalf("after the migration the counters hold %d logs, %d under review (%v); want 1 and 1", logs, review, err)
	}
}

// zero reports whether c counts nothing: every number zero, every meter's
// line zero.
func zero(c finance.Counters) bool {
	for _, m := range c.Meters {
		if m.OverageTokens != 0 || m.BilledTokens != 0 {
			return false
		}
	}
	c.Meters = nil
	return reflect.DeepEqual(c, finance.Counters{})
}
