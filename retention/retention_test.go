package retention_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/retentiontest"
	"github.com/overage-billing/overage/retention"
	"github.com/overage-billing/overage/usagelog"
)

var (
	jan = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	feb = jan.AddDate(0, 1, 0)
	mar = jan.AddDate(0, 2, 0)
	apr = jan.AddDate(0, 3, 0)
)

// line is one meter line of a seeded log.
type line struct {
	meter           string
	tokens, overage int64
}

// seedLog is a usage log as the tests write it: minted (its id) at
// ingest, its usage at ts, its lines (the defaults' tokens as the view
// shows them, before the other meters of their dimension are added back).
type seedLog struct {
	tenant     uuid.UUID
	ingest, ts time.Time
	model      string
	status     string
	in, out    line
	others     []line
	corrects   *uuid.UUID
	// reportedAt, when set, makes the log late: its reports (one per line
	// with overage, the log their lead) carry this timestamp.
	reportedAt *time.Time
	period     *time.Time
}

// outputMeters are the seeded meters of the output dimension.
var outputMeters = map[string]bool{"reason_m": true}

func seed(t *testing.T, pool *pgxpool.Pool, logs ...seedLog) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	var ids []uuid.UUID
	for _, l := range logs {
		id := retentiontest.ID(l.ingest)
		ids = append(ids, id)
		inTotal, outTotal := l.in.tokens, l.out.tokens
		var keys []string
		var tokens, over []int64
		var leads []*uuid.UUID
		for _, o := range l.others {
			keys, tokens, over = append(keys, o.meter), append(tokens, o.tokens), append(over, o.overage)
			if outputMeters[o.meter] {
				outTotal += o.tokens
			} else {
				inTotal += o.tokens
			}
			if l.reportedAt != nil && o.overage != 0 {
				leads = append(leads, &id)
			} else {
				leads = append(leads, nil)
			}
		}
		period := time.Date(l.ts.Year(), l.ts.Month(), 1, 0, 0, 0, 0, time.UTC)
		if l.period != nil {
			period = *l.period
		}
		var stamp *string
		var inLead, outLead *uuid.UUID
		if l.reportedAt != nil {
			s := "reported"
			stamp = &s
			if l.in.overage != 0 {
				inLead = &id
			}
			if l.out.overage != 0 {
				outLead = &id
			}
		}
		var reason *string
		if l.corrects != nil {
			r := "test"
			reason = &r
		}
		if keys == nil {
			leads = nil
		}
		if slices.Equal(tokens, over) {
			tokens = nil // stored as ingest stores it: equal to meter_overage
		}
		if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens, period_start,
				overage_input_tokens, overage_output_tokens, billing_status, meter_keys, meter_tokens, meter_overage, meter_leads,
				input_report_lead, output_report_lead, stripe_timestamp, corrects, correction_reason, created_at)
			VALUES ($1, $2, $3, 'u', $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)`,
			id, l.tenant, l.ts, l.model, inTotal, outTotal, period, l.in.overage, l.out.overage, l.status,
			keys, tokens, over, leads, inLead, outLead, stamp, l.corrects, reason, l.ingest); err != nil {
			t.Fatalf("seed log: %v", err)
		}
		if l.reportedAt == nil {
			continue
		}
		for _, ln := range append([]line{{"input", 0, l.in.overage}, {"output", 0, l.out.overage}}, l.others...) {
			if ln.overage == 0 {
				continue
			}
			if _, err := pool.Exec(ctx, `INSERT INTO usage_reports (lead_usage_log_id, dimension, tenant_id, period_start, usage_day, value, ts,
					member_ids, state, first_attempt_at, accepted_at)
				VALUES ($1, $2, $3, $4, $5::timestamptz::date, $6, $7, ARRAY[$1::uuid], 'accepted', $7, $7)`,
				id, ln.meter, l.tenant, period, l.ts, ln.overage, *l.reportedAt); err != nil {
				t.Fatalf("seed report: %v", err)
			}
		}
	}
	return ids
}

func newTenants(t *testing.T, pool *pgxpool.Pool, n int) []uuid.UUID {
	t.Helper()
	var ids []uuid.UUID
	for i := range n {
		id := uuid.New()
		if _, err := pool.Exec(context.Background(), `INSERT INTO tenants (id, name, stripe_customer_id) VALUES ($1, $2, $3)`,
			id, fmt.Sprintf("tenant %d", i), fmt.Sprintf("cus_%d", i)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func seedMeters(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO meters (key, event_name, token_type, models) VALUES
		('cache_m', 'cache_tokens', 'cache_read', '{*}'), ('reason_m', 'reasoning_tokens', 'reasoning', '{*}')`); err != nil {
		t.Fatal(err)
	}
}

// rollupKey and rollupSums are a row of usage_rollups.
type rollupKey struct {
	tenant                  uuid.UUID
	day, meter, model, bday string
}

type rollupSums struct {
	logs, billedLogs, tokens, overage, billed, late int64
}

// expected sums the seeded logs as the rollups must: per tenant, usage
// day, meter, model and billing day.
func expected(logs []seedLog) map[rollupKey]rollupSums {
	out := map[rollupKey]rollupSums{}
	for _, l := range logs {
		billed := l.status == "billed"
		for _, ln := range append([]line{{"input", l.in.tokens, l.in.overage}, {"output", l.out.tokens, l.out.overage}}, l.others...) {
			bday := l.ts
			if l.reportedAt != nil && ln.overage != 0 {
				bday = *l.reportedAt
			}
			k := rollupKey{l.tenant, l.ts.Format(time.DateOnly), ln.meter, l.model, bday.Format(time.DateOnly)}
			s := out[k]
			s.logs++
			s.tokens += ln.tokens
			s.overage += ln.overage
			if billed {
				s.billedLogs++
				s.billed += ln.overage
				if l.reportedAt != nil {
					s.late += ln.overage
				}
			}
			out[k] = s
		}
	}
	return out
}

func readRollups(t *testing.T, pool *pgxpool.Pool) map[rollupKey]rollupSums {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT tenant_id, to_char(day, 'YYYY-MM-DD'), meter, model_id, to_char(billing_day, 'YYYY-MM-DD'),
		logs, billed_logs, tokens, overage_tokens, billed_tokens, late_billed_tokens FROM usage_rollups`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[rollupKey]rollupSums{}
	for rows.Next() {
		var k rollupKey
		var s rollupSums
		if err := rows.Scan(&k.tenant, &k.day, &k.meter, &k.model, &k.bday, &s.logs, &s.billedLogs, &s.tokens, &s.overage, &s.billed, &s.late); err != nil {
			t.Fatal(err)
		}
		out[k] = s
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func run(t *testing.T, pool *pgxpool.Pool, cfg retention.Config, dry bool) *retention.Result {
	t.Helper()
	res, err := retention.Run(context.Background(), pool, cfg, dry)
	if err != nil {
		t.Fatalf("retention run (dry %v): %v", dry, err)
	}
	return res
}

func decisions(res *retention.Result) string {
	var b strings.Builder
	for _, d := range res.Partitions {
		fmt.Fprintf(&b, "\n  %s: %s (%s)", d.Partition, d.Action, d.Reason)
	}
	return b.String()
}

func decisionOf(t *testing.T, res *retention.Result, name string) retention.Decision {
	t.Helper()
	for _, d := range res.Partitions {
		if d.Partition == name {
			return d
		}
	}
	t.Fatalf("no decision on %s:%s", name, decisions(res))
	return retention.Decision{}
}

func partitionExists(t *testing.T, pool *pgxpool.Pool, name string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

var cfg400 = retention.Config{Retention: retention.DefaultRetention, CloseGrace: time.Hour}

// The rollups of dropped partitions equal the sums of the logs they
// replace, per tenant, usage day, meter, model and billing day: default
// and other meters' lines, corrections (negative), not billable logs,
// logs reported late (billed on their report's day), and a usage day
// whose logs lie in two partitions (summed by both roll-ups). The
// dropped partitions and their reports' are gone, the watermark is the
// last one's upper bound, and a second run changes nothing.
func TestRollupsEqualTheLogsTheyReplace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	names := retentiontest.Replace(t, pool, jan, feb, mar, apr)
	seedMeters(t, pool)
	tenants := newTenants(t, pool, 3)
	rng := rand.New(rand.NewPCG(1, 2))
	models := []string{"gpt-4o", "claude", "llama"}
	var logs []seedLog
	for i := range 400 {
		ingest := jan.Add(time.Duration(rng.Int64N(int64(apr.Sub(jan)))))
		ts := ingest.Add(-time.Duration(rng.Int64N(int64(3 * 24 * time.Hour))))
		if i%50 == 0 { // the last day of January, ingested in February
			ts, ingest = time.Date(2024, 1, 31, 23, 0, 0, 0, time.UTC), time.Date(2024, 2, 1, 1, 0, 0, 0, time.UTC)
		}
		l := seedLog{tenant: tenants[rng.IntN(len(tenants))], ingest: ingest, ts: ts, model: models[rng.IntN(len(models))], status: "billed"}
		in, out := rng.Int64N(1000), rng.Int64N(1000)
		l.in, l.out = line{"input", in, in / 2}, line{"output", out, out / 3}
		switch rng.IntN(5) {
		case 0:
			l.others = []line{{"cache_m", 70, 70}}
		case 1:
			l.others = []line{{"cache_m", 30, 0}, {"reason_m", 40, 40}}
		case 2: // a correction giving tokens back
			orig := retentiontest.ID(ingest)
			l.corrects = &orig
			l.in, l.out = line{"input", -in, -in / 2}, line{"output", -out, 0}
			l.others = []line{{"reason_m", -20, -20}}
		case 3:
			l.status, l.in.overage, l.out.overage = "not_billable", 0, 0
		}
		if rng.IntN(6) == 0 && l.status == "billed" {
			r := ts.Add(50 * time.Hour)
			l.reportedAt = &r
		}
		logs = append(logs, l)
	}
	seed(t, pool, logs...)

	res := run(t, pool, cfg400, false)
	for _, n := range names {
		if d := decisionOf(t, res, n); d.Action != retention.ActionDropped {
			t.Fatalf("%s: %s (%s), want dropped:%s", n, d.Action, d.Reason, decisions(res))
		}
		if partitionExists(t, pool, n) || partitionExists(t, pool, strings.Replace(n, "usage_logs", "usage_reports", 1)) {
			t.Errorf("%s or its reports' partition is still there", n)
		}
	}
	for _, d := range res.Partitions[len(names):] {
		if d.Action != retention.ActionKept || d.Reason != "newer than 400d" {
			t.Errorf("%s: %s (%s), want kept: newer than 400d", d.Partition, d.Action, d.Reason)
		}
	}
	want, got := expected(logs), readRollups(t, pool)
	if !maps.Equal(got, want) {
		for k, w := range want {
			if got[k] != w {
				t.Errorf("rollup %+v: %+v, want %+v", k, got[k], w)
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("rollup %+v: %+v, want none", k, got[k])
			}
		}
		t.FailNow()
	}
	spanning := rollupKey{}
	for k, s := range want {
		if k.day == "2024-01-31" && k.meter == "input" && s.logs > 1 {
			spanning = k
		}
	}
	if spanning == (rollupKey{}) {
		t.Fatal("no rollup of 2024-01-31 sums logs of two partitions: the test lost its point")
	}
	w, err := usagelog.Watermark(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if w != usagelog.IDFloor(apr) {
		t.Errorf("watermark %s, want %s (the floor of April 2024)", w, usagelog.IDFloor(apr))
	}
	again := run(t, pool, cfg400, false)
	if again.Dropped() != 0 || !maps.Equal(readRollups(t, pool), want) {
		t.Errorf("a second run dropped %d and changed the rollups:%s", again.Dropped(), decisions(again))
	}
}

// A partition holding a log not final, an open report or a log of an
// open period is kept, says why, and keeps every newer one (partitions go
// oldest first); a dry run says the same and changes nothing. Once the
// blocker is resolved the next run drops the partitions.
func TestRetentionKeepsWhatMayNotGo(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		blocker func(tenant uuid.UUID) seedLog
		report  bool
		reason  string
		resolve string
	}{
		{name: "pending", blocker: func(tn uuid.UUID) seedLog {
			return seedLog{tenant: tn, ingest: feb.Add(time.Hour), ts: feb, model: "m", status: "pending", in: line{"input", 5, 5}}
		}, reason: "1 log not final (1 pending)", resolve: `UPDATE usage_logs SET billing_status = 'billed' WHERE billing_status = 'pending'`},
		{name: "needs_review", blocker: func(tn uuid.UUID) seedLog {
			return seedLog{tenant: tn, ingest: feb.Add(time.Hour), ts: feb, model: "m", status: "needs_review", in: line{"input", 5, 5}}
		}, reason: "1 log not final (1 needs_review)", resolve: `UPDATE usage_logs SET billing_status = 'not_billable' WHERE billing_status = 'needs_review'`},
		{name: "open report", blocker: func(tn uuid.UUID) seedLog {
			return seedLog{tenant: tn, ingest: feb.Add(time.Hour), ts: feb, model: "m", status: "billed", in: line{"input", 5, 5}}
		}, report: true, reason: "1 open report", resolve: `UPDATE usage_reports SET state = 'accepted' WHERE state = 'open'`},
		{name: "open period", blocker: func(tn uuid.UUID) seedLog {
			// A subscription period that began in February 2024 and is
			// still running: its logs are not closed.
			p := feb
			return seedLog{tenant: tn, ingest: feb.Add(time.Hour), ts: feb, model: "m", status: "billed", in: line{"input", 5, 5}, period: &p}
		}, reason: "period 2024-02 of tenant %s not closed",
			resolve: `INSERT INTO closed_periods (tenant_id, stripe_invoice_id, period_start, period_end, event_created)
				SELECT id, 'in_1', '2024-02-01', now(), now() FROM tenants`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, _ := pgtest.NewPool(t)
			names := retentiontest.Replace(t, pool, jan, feb, mar, apr)
			tn := newTenants(t, pool, 1)[0]
			if c.name == "open period" {
				if _, err := pool.Exec(ctx, `INSERT INTO tenant_subscriptions (tenant_id, stripe_subscription_id, status, current_period_start, current_period_end, event_created)
					VALUES ($1, 'sub_1', 'active', '2024-02-01', now() + interval '30 days', now())`, tn); err != nil {
					t.Fatal(err)
				}
			}
			final := func(at time.Time) seedLog {
				return seedLog{tenant: tn, ingest: at, ts: at, model: "m", status: "billed", in: line{"input", 10, 10}, out: line{"output", 1, 1}}
			}
			seed(t, pool, final(jan.Add(time.Hour)), final(feb.Add(2*time.Hour)), final(mar.Add(time.Hour)))
			ids := seed(t, pool, c.blocker(tn))
			if c.report {
				if _, err := pool.Exec(ctx, `INSERT INTO usage_reports (lead_usage_log_id, dimension, tenant_id, period_start, usage_day, value, ts,
						member_ids, state, first_attempt_at) VALUES ($1, 'input', $2, '2024-02-01', '2024-02-01', 5, '2024-02-01', ARRAY[$1::uuid], 'open', now())`,
					ids[0], tn); err != nil {
					t.Fatal(err)
				}
			}
			reason := c.reason
			if strings.Contains(reason, "%s") {
				reason = fmt.Sprintf(reason, tn)
			}

			for _, dry := range []bool{true, false} {
				res := run(t, pool, cfg400, dry)
				first := decisionOf(t, res, names[0])
				wantFirst := retention.ActionDropped
				if dry {
					wantFirst = retention.ActionRollUp
				}
				if first.Action != wantFirst || first.Logs == nil || *first.Logs != 1 {
					t.Fatalf("dry %v: %s %s (%s), want %s of 1 log:%s", dry, names[0], first.Action, first.Reason, wantFirst, decisions(res))
				}
				if d := decisionOf(t, res, names[1]); d.Action != retention.ActionKept || d.Reason != reason {
					t.Errorf("dry %v: %s %s (%s), want kept: %s", dry, names[1], d.Action, d.Reason, reason)
				}
				if d := decisionOf(t, res, names[2]); d.Action != retention.ActionKept || !strings.Contains(d.Reason, "an older partition ("+names[1]+") is kept") {
					t.Errorf("dry %v: %s %s (%s), want kept behind %s", dry, names[2], d.Action, d.Reason, names[1])
				}
				if partitionExists(t, pool, names[0]) != dry || !partitionExists(t, pool, names[1]) || !partitionExists(t, pool, names[2]) {
					t.Errorf("dry %v: partitions there: %v %v %v", dry,
						partitionExists(t, pool, names[0]), partitionExists(t, pool, names[1]), partitionExists(t, pool, names[2]))
				}
				var rollups int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_rollups`).Scan(&rollups); err != nil {
					t.Fatal(err)
				}
				if w, _ := usagelog.Watermark(ctx, pool); dry && (rollups != 0 || w != uuid.Nil) {
					t.Errorf("the dry run wrote %d rollups, watermark %s", rollups, w)
				}
			}
			if _, err := pool.Exec(ctx, c.resolve); err != nil {
				t.Fatal(err)
			}
			res := run(t, pool, cfg400, false)
			for _, n := range names[1:] {
				if d := decisionOf(t, res, n); d.Action != retention.ActionDropped {
					t.Errorf("after resolving: %s %s (%s), want dropped", n, d.Action, d.Reason)
				}
			}
		})
	}
}

// USAGE_LOG_RETENTION=0 keeps every partition, however old.
func TestRetentionZeroKeepsEverything(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	names := retentiontest.Replace(t, pool, jan, feb)
	res := run(t, pool, retention.Config{Retention: 0}, false)
	if d := decisionOf(t, res, names[0]); d.Action != retention.ActionKept || d.Reason != "USAGE_LOG_RETENTION=0 keeps every log" {
		t.Errorf("%s: %s (%s)", names[0], d.Action, d.Reason)
	}
	if !partitionExists(t, pool, names[0]) {
		t.Error("dropped with retention 0")
	}
}

// A run interrupted after its roll-up committed (the partition recorded
// rolled up, still attached) is finished by the next: the partition is
// dropped and the rollups are not added twice.
func TestRetentionResumesAnInterruptedDrop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	names := retentiontest.Replace(t, pool, jan, feb)
	tn := newTenants(t, pool, 1)[0]
	seed(t, pool, seedLog{tenant: tn, ingest: jan.Add(time.Hour), ts: jan, model: "m", status: "billed", in: line{"input", 10, 10}})
	ps, err := usagelog.Partitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := usagelog.RollUpTx(ctx, tx, usagelog.RollUp{Partition: ps[0].Name, ReportsPartition: ps[0].Reports,
		Below: ps[0].UpperID, BelowAt: ps[0].Upper, Logs: 1}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	dry := run(t, pool, cfg400, true)
	if d := decisionOf(t, dry, names[0]); d.Action != retention.ActionRollUp || !strings.Contains(d.Reason, "its drop is to be finished") {
		t.Errorf("dry run: %s (%s)", d.Action, d.Reason)
	}
	res := run(t, pool, cfg400, false)
	if d := decisionOf(t, res, names[0]); d.Action != retention.ActionDropped || !strings.Contains(d.Reason, "drop finished") {
		t.Errorf("%s (%s), want the drop finished", d.Action, d.Reason)
	}
	if partitionExists(t, pool, names[0]) {
		t.Error("still there")
	}
	got := readRollups(t, pool)
	if k := (rollupKey{tn, "2024-01-01", "input", "m", "2024-01-01"}); got[k].logs != 1 || got[k].billed != 10 {
		t.Errorf("rollup %+v after the resumed run, want 1 log and 10 billed", got[k])
	}
	if n := len(slices.Collect(maps.Keys(got))); n != 2 {
		t.Errorf("%d rollups, want 2 (input, output)", n)
	}
}

// ParseRetention and FormatRetention agree with the README's table.
func TestParseRetention(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"400d": retention.DefaultRetention, "0": 0, "720h": 30 * 24 * time.Hour, "1d": 24 * time.Hour} {
		got, err := retention.ParseRetention(in)
		if err != nil || got != want {
			t.Errorf("ParseRetention(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1d", "0d", "x", "-5h", "1.5d"} {
		if _, err := retention.ParseRetention(bad); err == nil {
			t.Errorf("ParseRetention(%q) accepted", bad)
		}
	}
	if s := retention.FormatRetention(retention.DefaultRetention); s != "400d" {
		t.Errorf("FormatRetention(default) = %q", s)
	}
}

// A report goes with its lead, its oldest member: a late report whose
// lead's partition is dropped while a later member is kept still bills
// that member on the report's day, before and after the drop.
func TestLateReportSpanningTwoPartitionsKeepsItsDay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	names := retentiontest.Replace(t, pool, jan, feb, mar)
	tn := newTenants(t, pool, 1)[0]
	usage := time.Date(2024, 1, 31, 22, 0, 0, 0, time.UTC)
	reported := time.Date(2024, 2, 3, 12, 0, 0, 0, time.UTC)
	lead := seed(t, pool, seedLog{tenant: tn, ingest: usage.Add(time.Hour), ts: usage, model: "m", status: "billed",
		in: line{"input", 10, 10}, reportedAt: &reported})[0]
	member := retentiontest.ID(feb.Add(time.Hour))
	if _, err := pool.Exec(ctx, `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens, period_start,
			overage_input_tokens, overage_output_tokens, billing_status, input_report_lead, stripe_timestamp)
		VALUES ($1, $2, $3, 'u', 'm', 7, 0, '2024-01-01', 7, 0, 'billed', $4, 'reported')`, member, tn, usage, lead); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE usage_reports SET member_ids = ARRAY[$1::uuid, $2::uuid], value = 17 WHERE lead_usage_log_id = $1`, lead, member); err != nil {
		t.Fatal(err)
	}
	seed(t, pool, seedLog{tenant: tn, ingest: feb.Add(2 * time.Hour), ts: feb, model: "m", status: "pending", in: line{"input", 1, 1}})
	billed := func() map[usagelog.BilledKey]int64 {
		s, err := usagelog.Billed(ctx, pool, usagelog.BilledParams{From: jan, End: mar, Cutoff: mar})
		if err != nil {
			t.Fatal(err)
		}
		out := map[usagelog.BilledKey]int64{}
		for k, n := range s.Overage {
			if n != 0 {
				out[k] = n
			}
		}
		return out
	}
	before := billed()
	if want := (usagelog.BilledKey{Customer: "cus_0", Meter: "input", Day: "2024-02-03"}); before[want] != 17 || len(before) != 1 {
		t.Fatalf("billed before the drop %v, want 17 on %v only", before, want)
	}
	res := run(t, pool, cfg400, false)
	if decisionOf(t, res, names[0]).Action != retention.ActionDropped || decisionOf(t, res, names[1]).Action != retention.ActionKept {
		t.Fatalf("want %s dropped and %s kept:%s", names[0], names[1], decisions(res))
	}
	if after := billed(); !maps.Equal(after, before) {
		t.Errorf("billed after the drop %v, before %v", after, before)
	}
}
