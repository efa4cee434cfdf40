package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/internal/testkit/parttest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// The ingest transaction's lookups read what they answer, whatever the
// statistics were when their generic plan was made: a plan cached while
// the tables were empty (never analysed) or tiny (analysed at 5 rows) is
// used on a tenant holding 50,000 keys and logs, and must still read a
// handful of pages. The same measure applied to the lookup as it was
// before (tenant_id = $1 AND idempotency_key = ANY($2), default planner
// settings) reads the tenant's every record when its plan was made at 5
// rows, so the test can fail.
func TestLookupsReadOnlyWhatTheyAnswerAtAnyStatistics(t *testing.T) {
	t.Parallel()
	const grown = 50_000
	oldLookup := `SELECT idempotency_key, fingerprint, response_status, response_body, usage_log_id, expires_at <= now()
		FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = ANY($2)`
	statements := []struct {
		name, sql, args string
		settings        bool // run under txSettingsSQL, as ingest does
		wantBounded     bool
	}{
		{"keys", idempotency.LookupSQL, `(%s, '{k1,k2,missing}')`, true, true},
		{"logs by request_id", logsByRequestIDSQL, `(%s, '{r1,r2,missing}')`, true, true},
		{"delete expired key", idempotency.DeleteExpiredSQL, `(%s, 'k3', now())`, true, true},
		{"the lookup before (control)", oldLookup, `(%s, '{k1,k2,missing}')`, false, false},
	}
	for _, stats := range []struct {
		name string
		rows int // rows seeded, and ANALYZE'd when > 0, before the plans are made
	}{{"never analysed", 0}, {"analysed at 5 rows", 5}} {
		for _, shape := range indexShapes {
			t.Run(stats.name+"/"+shape.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				pool, _ := pgtest.NewPool(t)
				parttest.Reindex(t, pool, "usage_logs_legacy", shape.shape)
				tenant := uuid.New()
				seedKeysAndLogs(t, pool, tenant, 1, stats.rows)
				if stats.rows > 0 {
					if _, err := pool.Exec(ctx, `ANALYZE idempotency_keys; ANALYZE usage_logs`); err != nil {
						t.Fatal(err)
					}
				}
				conn, err := pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Release()
				// Make and cache each generic plan now, as the first ingest
				// transactions on a new connection do.
				for i, s := range statements {
					inTx(t, conn.Conn(), s.settings, func(tx pgx.Tx) {
						if _, err := tx.Prepare(ctx, fmt.Sprintf("s%d", i), s.sql); err != nil {
							t.Fatalf("%s: prepare: %v", s.name, err)
						}
						if _, err := tx.Exec(ctx, fmt.Sprintf("EXECUTE s%d", i)+fmt.Sprintf(s.args, "'"+tenant.String()+"'")); err != nil {
							t.Fatalf("%s: execute: %v", s.name, err)
						}
					})
				}
				seedKeysAndLogs(t, pool, tenant, stats.rows+1, grown)
				for i, s := range statements {
					var plan []map[string]any
					inTx(t, conn.Conn(), s.settings, func(tx pgx.Tx) {
						var raw []byte
						q := fmt.Sprintf("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE s%d", i) + fmt.Sprintf(s.args, "'"+tenant.String()+"'")
						if err := tx.QueryRow(ctx, q).Scan(&raw); err != nil {
							t.Fatalf("%s: explain: %v", s.name, err)
						}
						if err := json.Unmarshal(raw, &plan); err != nil {
							t.Fatal(err)
						}
					})
					top := plan[0]["Plan"].(map[string]any)
					pages := top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64)
					removed := rowsRemoved(top)
					// A few pages a probe; a filter may drop a row a probe (the
					// delete's expires_at), never the tenant's rows.
					bounded := pages <= 40 && removed <= 3
					if !s.wantBounded && stats.rows == 0 {
						continue // the old lookup happened to be planned well on an empty table
					}
					if bounded != s.wantBounded {
						out, _ := json.MarshalIndent(top, "", "  ")
						t.Errorf("%s on %d rows of one tenant: %v pages read, %v rows removed by filters; want bounded %v\n%s",
							s.name, grown, pages, removed, s.wantBounded, out)
					}
				}
			})
		}
	}
}

// indexShapes are the shapes a usage log partition's unique index on
// request_id can have: every lookup by request_id reads only what it
// answers on each.
var indexShapes = []struct {
	name  string
	shape parttest.IndexShape
}{{"request key", parttest.KeyIndex}, {"request_id digest", parttest.DigestIndex}, {"request_id", parttest.RequestIDIndex}}

// inTx runs f in a transaction of conn, with the ingest settings when
// settings is set, as plan_cache_mode force_generic_plan (single events).
func inTx(t *testing.T, conn *pgx.Conn, settings bool, f func(pgx.Tx)) {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if settings {
		if _, err := tx.Exec(ctx, `SELECT `+txSettingsSQL); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	f(tx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// seedKeysAndLogs writes keys k<from>..k<to> and logs r<from>..r<to> of
// tenant, live for a day.
func seedKeysAndLogs(t *testing.T, pool *pgxpool.Pool, tenant uuid.UUID, from, to int) {
	t.Helper()
	if to < from {
		return
	}
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id) VALUES ($1, 't', 'cus_t') ON CONFLICT DO NOTHING`, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
		SELECT $1, 'k' || g, '\x00', 202, '\x7b7d', now() + interval '23 hours' FROM generate_series($2::int, $3::int) g`, tenant, from, to); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status)
		SELECT uuidv7(), $1, 'r' || g, now(), 'u', 'm', 1, 1, date_trunc('month', now()), 0, 0, 'not_billable'
		FROM generate_series($2::int, $3::int) g`, tenant, from, to); err != nil {
		t.Fatal(err)
	}
}

// rowsRemoved sums "Rows Removed by Filter" over a plan tree.
func rowsRemoved(node map[string]any) float64 {
	n, _ := node["Rows Removed by Filter"].(float64)
	if subs, ok := node["Plans"].([]any); ok {
		for _, s := range subs {
			n += rowsRemoved(s.(map[string]any))
		}
	}
	if strings.Contains(fmt.Sprint(node["Node Type"]), "Seq Scan") {
		n += node["Actual Rows"].(float64) + 1
	}
	return n
}

// The reads of GET /v1/usage-events/{id} and ?request_id= read what they
// answer whatever the statistics were when their plans were made: plans
// cached on empty tables or at 5 rows are used on 50,000 logs of the
// tenant, in transactions opened by readSettingsSQL as Get and ByRequestID
// open theirs. The read by id run without it (as it was) reads every log
// once its plan was made at 5 rows, so the measure can fail.
func TestReadsOfUsageEventsReadOnlyWhatTheyAnswerAtAnyStatistics(t *testing.T) {
	t.Parallel()
	const grown = 50_000
	for _, stats := range []struct {
		name string
		rows int
	}{{"never analysed", 0}, {"analysed at 5 rows", 5}} {
		for _, shape := range indexShapes {
			t.Run(stats.name+"/"+shape.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				pool, _ := pgtest.NewPool(t)
				parttest.Reindex(t, pool, "usage_logs_legacy", shape.shape)
				tenant := uuid.New()
				known := uuid.Must(uuid.NewV7()) // a usage log id: UUIDv7, in a partition
				id := fmt.Sprintf("('%s')", known)
				probes := []pgtest.Probe{
					{Name: "log by id", SQL: getLogSQL, Args: id, Settings: readSettingsSQL},
					{Name: "corrections of", SQL: correctionsOfSQL, Args: id, Settings: readSettingsSQL},
					{Name: "stream", SQL: streamSQL, Args: fmt.Sprintf("('%s', 'r1')", tenant), Settings: readSettingsSQL},
					{Name: "logs by request_id", SQL: byRequestIDSQL, Args: fmt.Sprintf("('%s', 'r1', NULL, 51)", tenant), Settings: readSettingsSQL},
					{Name: "log by id before (control)", SQL: getLogSQL, Args: id},
				}
				seedKeysAndLogs(t, pool, tenant, 1, stats.rows)
				if stats.rows > 0 {
					if _, err := pool.Exec(ctx, `ANALYZE usage_logs; ANALYZE usage_streams`); err != nil {
						t.Fatal(err)
					}
				}
				conn, err := pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Release()
				pgtest.CachePlans(t, conn.Conn(), probes)
				seedKeysAndLogs(t, pool, tenant, stats.rows+1, grown)
				if _, err := pool.Exec(ctx, `UPDATE usage_logs SET id = $2 WHERE tenant_id = $1 AND request_id = 'r1'`, tenant, known); err != nil {
					t.Fatal(err)
				}
				for i, r := range pgtest.PlanReads(t, conn.Conn(), probes) {
					control := strings.HasSuffix(probes[i].Name, "(control)")
					if control && stats.rows == 0 {
						continue
					}
					if bounded := r.Pages <= 40 && r.Removed <= 3; bounded == control {
						t.Errorf("%s on %d logs of one tenant: %v pages read, %v rows removed by filters; want bounded %v\n%s",
							probes[i].Name, grown, r.Pages, r.Removed, !control, r.Plan)
					}
				}
			})
		}
	}
}
