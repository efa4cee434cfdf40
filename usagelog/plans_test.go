package usagelog

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// planTenant owns every log the plan tests seed.
const planTenant = "00000000-0000-4000-8000-00000000ffff"

// planLog is the id of seeded log g; planLead the lead of its report.
func planLog(g int) string  { return fmt.Sprintf("00000000-0000-4000-8000-%012x", g) }
func planLead(g int) string { return fmt.Sprintf("00000000-0000-4000-9000-%012x", g) }

// The report store's statements read what they answer whatever the
// statistics were when their plans were made: a generic plan cached while
// the tables were empty (never analysed) or tiny (analysed at 5 rows) is
// used on 50,000 logs and reports of the tenant, of which the answer is
// one or two, and must still read a handful of pages. Each statement runs
// as its code runs it, after the transaction's planSettingsSQL or
// indexPlansSQL where the code sets them. The membership update run
// without the settings (the statement as it was) reads the whole table
// once its plan was made small, so the measure can fail.
func TestReportStatementsReadOnlyWhatTheyAnswerAtAnyStatistics(t *testing.T) {
	t.Parallel()
	const grown = 50_000
	ids := func(gs ...int) string {
		var s []string
		for _, g := range gs {
			s = append(s, planLog(g))
		}
		return "'{" + strings.Join(s, ",") + "}'"
	}
	missing := "00000000-0000-4000-8000-0000000fffff"
	probes := []pgtest.Probe{
		{Name: "lock candidates", SQL: lockCandidatesSQL, Args: fmt.Sprintf("('%s', 100)", planTenant), Settings: indexPlansSQL},
		{Name: "form membership", SQL: formMembershipSQL, Settings: planSettingsSQL,
			Args: fmt.Sprintf("(ARRAY['%s', '%s']::uuid[], ARRAY['%s', NULL]::uuid[], '{NULL,NULL}', '{}', '{0,0}', '{0,0}', '{usage,usage}')", planLog(1), missing, planLog(1))},
		{Name: "accept members (a pending log)", SQL: acceptMembersSQL, Settings: planSettingsSQL,
			Args: fmt.Sprintf("(%s, '{t,t}', '{t,t}', '{NULL,NULL}')", ids(1, 0xfffff))},
		{Name: "accept members (a log under review)", SQL: acceptMembersSQL, Settings: planSettingsSQL,
			Args: fmt.Sprintf("(%s, '{t,t}', '{t,t}', '{NULL,NULL}')", ids(2, 0xfffff))},
		{Name: "close members", SQL: closeMembersSQL, Settings: planSettingsSQL, Args: fmt.Sprintf("(%s, 'failed', 'x')", ids(1, 0xfffff))},
		{Name: "resolve reports", SQL: resolveReportsSQL, Settings: planSettingsSQL, Args: fmt.Sprintf("('%s', 'accepted', 'x')", planLog(2))},
		{Name: "lock for review", SQL: lockForReviewSQL, Settings: planSettingsSQL, Args: fmt.Sprintf("('%s', 86400)", planLog(2))},
		{Name: "tenant of", SQL: tenantOfSQL, Settings: planSettingsSQL, Args: fmt.Sprintf("('%s')", planLog(2))},
		{Name: "resolve logs", SQL: resolveLogsSQL, Settings: planSettingsSQL, Args: fmt.Sprintf("(%s, 'billed', 'x')", ids(2))},
		{Name: "release", SQL: releaseSQL, Settings: planSettingsSQL, Args: fmt.Sprintf("('{%s}', '{input}')", planLead(3))},
		{Name: "tenants pending since", SQL: tenantsPendingSinceSQL, Args: "(0)"},
		{Name: "claim", SQL: claimSQL, Settings: indexPlansSQL, Args: fmt.Sprintf("('%s', 60, 100, 60)", planTenant)},
		{Name: "held for", SQL: heldForSQL, Settings: planSettingsSQL, Args: fmt.Sprintf("('%s')", planTenant)},
		{Name: "expired reports", SQL: expiredReportsSQL, Settings: planSettingsSQL, Args: "(100, 60)"},
		{Name: "backlog", SQL: backlogSQL, Settings: backlogSettingsSQL},
		{Name: "backlog before (control)", SQL: backlogSQL},
		{Name: "membership before (control)", SQL: formMembershipSQL,
			Args: fmt.Sprintf("(ARRAY['%s', '%s']::uuid[], ARRAY['%s', NULL]::uuid[], '{NULL,NULL}', '{}', '{0,0}', '{0,0}', '{usage,usage}')", planLog(1), missing, planLog(1))},
	}
	for _, stats := range []struct {
		name    string
		rows    int // logs seeded before the plans are made
		analyse bool
	}{{"never analysed", 0, false}, {"analysed empty", 0, true}, {"analysed at 5 rows", 5, true}} {
		t.Run(stats.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, _ := pgtest.NewPool(t)
			seedPlanLogs(t, pool, 1, stats.rows)
			if stats.analyse {
				if _, err := pool.Exec(ctx, `ANALYZE usage_logs; ANALYZE usage_reports; ANALYZE tenants`); err != nil {
					t.Fatal(err)
				}
			}
			conn, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			pgtest.CachePlans(t, conn.Conn(), probes)
			seedPlanLogs(t, pool, stats.rows+1, grown)
			for i, r := range pgtest.PlanReads(t, conn.Conn(), probes) {
				control := strings.HasSuffix(probes[i].Name, "(control)")
				// A few pages a probe, an updated row's index entries (and
				// their page splits) included, against some 1,800 for a
				// sequential scan; a filter may drop a row a probe, never the
				// tenant's rows.
				bounded := r.Pages <= 120 && r.Removed <= 3
				if control && !stats.analyse {
					continue // planned well on an empty table, by luck
				}
				if control && bounded {
					// On partitioned tables the planner may also plan a
					// control well by luck (per-partition statistics), so
					// a bounded control is reported, not failed; the fixed
					// statements must be bounded at every statistics.
					t.Logf("%s on %d logs and reports: planned well by luck (%v pages)", probes[i].Name, grown, r.Pages)
					continue
				}
				if bounded == control {
					t.Errorf("%s on %d logs and reports: %v pages read, %v rows removed by filters; want bounded %v\n%s",
						probes[i].Name, grown, r.Pages, r.Removed, !control, r.Plan)
				}
			}
		})
	}
}

// seedPlanLogs writes logs from..to of planTenant, each with its input
// report: log 1 pending (in no report), log 2 under review with its report,
// log 3 billed with an open report, the others billed and accepted; every
// fifth with a line of another meter.
func seedPlanLogs(t *testing.T, pool *pgxpool.Pool, from, to int) {
	t.Helper()
	if to < from {
		return
	}
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name, stripe_customer_id) VALUES ($1, 't', 'cus_t') ON CONFLICT DO NOTHING`, planTenant); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
			period_start, overage_input_tokens, overage_output_tokens, billing_status, input_report_lead, first_attempt_at,
			input_accepted_at, output_accepted_at, billed_at, created_at,
			meter_keys, meter_tokens, meter_overage, meter_leads, meter_accepted_at)
		SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, $1, 'r' || g, now(), 'u', 'm', 10, 10,
			date_trunc('month', now()), 10, 0, st,
			CASE WHEN g > 1 THEN ('00000000-0000-4000-9000-' || lpad(to_hex(g), 12, '0'))::uuid END,
			CASE WHEN g > 1 THEN now() - interval '2 days' END,
			CASE WHEN st = 'billed' THEN now() END, NULL, CASE WHEN st = 'billed' THEN now() END,
			now() - interval '1 day' + g * interval '1 ms',
			CASE WHEN g % 5 = 0 THEN '{cached_in}'::text[] END, CASE WHEN g % 5 = 0 THEN '{0}'::bigint[] END,
			CASE WHEN g % 5 = 0 THEN '{0}'::bigint[] END, CASE WHEN g % 5 = 0 THEN '{NULL}'::uuid[] END,
			CASE WHEN g % 5 = 0 THEN '{NULL}'::timestamptz[] END
		FROM (SELECT g, CASE g WHEN 1 THEN 'pending' WHEN 2 THEN 'needs_review' ELSE 'billed' END AS st
			FROM generate_series($2::int, $3::int) g) s`, planTenant, from, to); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_reports (lead_usage_log_id, dimension, tenant_id, period_start, usage_day, value, ts,
			member_ids, state, first_attempt_at, accepted_at)
		SELECT ('00000000-0000-4000-9000-' || lpad(to_hex(g), 12, '0'))::uuid, 'input', $1, date_trunc('month', now()), current_date, 10, now(),
			ARRAY[('00000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid],
			CASE g WHEN 2 THEN 'needs_review' WHEN 3 THEN 'open' ELSE 'accepted' END, now() - interval '2 days',
			CASE WHEN g > 3 THEN now() END
		FROM generate_series(greatest($2::int, 2), $3::int) g`, planTenant, from, to); err != nil {
		t.Fatal(err)
	}
}

// indexPlans gives the walk generic plans over index scans only, and
// customPlans the statements after it custom plans and the scans as they
// were before: a session that had bitmap scans off keeps them off.
func TestIndexPlansThenCustomPlansRestoreTheScans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET enable_bitmapscan = off`); err != nil {
		t.Fatal(err)
	}
	settings := func(tx pgx.Tx) [3]string {
		t.Helper()
		var s [3]string
		if err := tx.QueryRow(ctx, `SELECT current_setting('plan_cache_mode'), current_setting('enable_seqscan'),
				current_setting('enable_bitmapscan')`).Scan(&s[0], &s[1], &s[2]); err != nil {
			t.Fatal(err)
		}
		return s
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	customPlans, err := indexPlans(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := settings(tx), [3]string{"force_generic_plan", "off", "off"}; got != want {
		t.Errorf("for the walk: %v, want %v", got, want)
	}
	if err := customPlans(); err != nil {
		t.Fatal(err)
	}
	if got, want := settings(tx), [3]string{"force_custom_plan", "on", "off"}; got != want {
		t.Errorf("after the walk: %v, want %v", got, want)
	}
}
