// Package usagelog is the one owner of the usage-log billing state machine
// and of the reports that carry usage logs to Stripe. Every transition of a
// usage log's billing_status and of a report's state is a method here; the
// workers, the sweep, operator review, the demo and the tests go through it,
// and nothing else writes billing_status (ingest inserts a log as pending or
// not_billable).
//
// A report is one Stripe meter event: the overage of one dimension of one or
// more pending usage logs of one tenant, allowance period and UTC day of
// their usage timestamps (or, for logs of a period closed when it is
// formed, a report of their own timestamped with its formation: see
// PeriodClosedSQL and Form). Its members, value and timestamp are committed
// before its first send and never change; its identifier and
// Idempotency-Key are overage.MeterEventKey(lead, dimension), the lead being
// the member fixed when the report is formed. A usage log is in at most one
// report per dimension (usage_logs.<dimension>_report_lead is set once, by
// the transaction that forms the report, under FOR UPDATE SKIP LOCKED).
//
// Locking. Changing a usage log's billing_status fires the billing_counters
// trigger, which upserts the (tenant, old status) and (tenant, new status)
// counter rows (migrations/0002_finance.sql). Every transaction here touches
// the logs of one tenant and orders its statements so that the counter rows
// are taken in (tenant_id, billing_status) order — billed < failed <
// needs_review < not_billable < pending — across the whole transaction, not
// only within one row: two such transactions may wait for each other but
// never in a cycle.
//
// Ownership. The package owns the tables usage_logs and usage_reports
// (docs/architecture.md): every statement on them is here — ingest's
// inserts aside — or is built from a fragment exported here (Is,
// PeriodOfSQL, PeriodClosedSQL, OldestPendingSQL, CountersSQL) by a
// package whose own tables the statement is about. So every shape in
// which they are read, and the plan settings each needs, is in one place;
// the billed sums per customer and meter are Billed, and only Billed.
// Statements here may join tenants read-only, by key, for a column they
// show; they never write it.
package usagelog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
)

// Statuses lists every billing status in the order finance prints them.
var Statuses = []overage.BillingStatus{overage.BillingStatusBilled, overage.BillingStatusPending, overage.BillingStatusNotBillable, overage.BillingStatusNeedsReview, overage.BillingStatusFailed}

// ReportState is where a report stands with Stripe.
type ReportState string

const (
	// ReportOpen: to be sent, or sent again (same key, value, timestamp).
	ReportOpen ReportState = "open"
	// ReportAccepted: Stripe holds it, or it summed to zero and was never
	// sent; its members' dimension is accepted.
	ReportAccepted ReportState = "accepted"
	// ReportNeedsReview: its first send is older than Stripe's idempotency
	// window minus the margin; never resent automatically.
	ReportNeedsReview ReportState = "needs_review"
	// ReportFailed: Stripe refused it with an error retrying cannot fix.
	ReportFailed ReportState = "failed"
	// ReportVoid: an operator decided it is never billed.
	ReportVoid ReportState = "void"
)

// Report is one meter event's worth of usage logs.
type Report struct {
	Lead      uuid.UUID
	Dimension overage.Dimension
	TenantID  uuid.UUID
	Value     int64
	// Timestamp is the latest usage timestamp among the members, or the
	// formation time for a report of a closed period (TimestampReported).
	Timestamp      time.Time
	Members        []uuid.UUID
	State          ReportState
	FirstAttemptAt time.Time
	// Remaining is how long sends may still go out, by the database clock:
	// the window guard's cutoff minus the age of the first attempt.
	Remaining time.Duration
}

// Key is the report's meter event identifier and Stripe Idempotency-Key.
func (r Report) Key() string { return overage.MeterEventKey(r.Lead, r.Dimension) }

// Store reads and changes usage logs' billing state and reports.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a Store on pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Pool is the store's pool, for callers that open a transaction spanning
// the store and their own tables (review's audit trail).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// DB is what the transaction-taking methods need: a pgx.Tx or a pool.
type DB = overage.DB

// Guard is the window guard: a report whose first send is older than
// Window minus Margin is never resent automatically.
type Guard struct {
	Window time.Duration
	Margin time.Duration
}

// GuardFor leaves room for clock skew between us and Stripe and for a send
// in flight: a margin of a tenth of the window, at most an hour.
func GuardFor(window time.Duration) Guard {
	return Guard{Window: window, Margin: min(window/10, time.Hour)}
}

// Cutoff is how long after the first attempt sends must stop.
func (g Guard) Cutoff() time.Duration { return g.Window - g.Margin }

// reportColumns are the columns scanReport reads, of the table aliased
// prefix; $cutoffArg is the guard's cutoff in seconds.
func reportColumns(prefix string, cutoffArg int) string {
	return fmt.Sprintf(`%[1]slead_usage_log_id, %[1]sdimension, %[1]stenant_id, %[1]svalue, %[1]sts, %[1]smember_ids, %[1]sstate,
	%[1]sfirst_attempt_at, extract(epoch FROM %[1]sfirst_attempt_at + make_interval(secs => $%[2]d) - now())::float8`, prefix, cutoffArg)
}

func scanReport(row pgx.Row) (Report, error) {
	var r Report
	var remaining float64
	err := row.Scan(&r.Lead, &r.Dimension, &r.TenantID, &r.Value, &r.Timestamp, &r.Members, &r.State, &r.FirstAttemptAt, &remaining)
	r.Timestamp, r.FirstAttemptAt = r.Timestamp.UTC(), r.FirstAttemptAt.UTC()
	r.Remaining = time.Duration(remaining * float64(time.Second))
	return r, err
}

func collectReports(rows pgx.Rows, err error) ([]Report, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Report, error) { return scanReport(row) })
}

// ClaimParams selects open reports of a tenant to send again.
type ClaimParams struct {
	TenantID uuid.UUID
	Limit    int
	// Lease is how long the caller holds the reports; a killed caller's
	// lease lapses and another job sends them.
	Lease time.Duration
	Guard Guard
}

// Claim leases up to Limit open reports of the tenant that no one holds,
// oldest first: reports formed earlier whose send failed, was cut short by
// a crash, or never happened. SKIP LOCKED and the lease condition, checked
// again by the UPDATE, referee two jobs of one tenant.
func (s *Store) Claim(ctx context.Context, p ClaimParams) ([]Report, error) {
	var rs []Report
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := indexPlans(ctx, tx); err != nil {
			return err
		}
		var err error
		rs, err = collectReports(tx.Query(ctx, claimSQL, p.TenantID, p.Lease.Seconds(), p.Limit, p.Guard.Cutoff().Seconds()))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim open reports of tenant %s: %w", p.TenantID, err)
	}
	return rs, nil
}

// claimSQL leases up to $3 open reports of tenant $1 for $2 seconds ($4:
// the guard's cutoff, in seconds).
//
// The reports locked are updated by their ctid (a TID scan of the locked
// rows, which no other transaction can move meanwhile). Joined back by
// key instead, the planner without statistics drives the join from the
// whole table (docs/plans.md, "Claim"). usage_reports being partitioned,
// a ctid names a row only with its partition (tableoid): the TID scan
// runs in every partition, and the pair keeps only the rows locked.
var claimSQL = `WITH c AS (SELECT tableoid AS t, ctid AS c FROM usage_reports
			WHERE tenant_id = $1 AND state = 'open' AND (lease_until IS NULL OR lease_until < now())
			ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED)
	UPDATE usage_reports r SET lease_until = now() + make_interval(secs => $2)
		WHERE r.ctid = ANY (ARRAY(SELECT c.c FROM c)) AND (r.tableoid, r.ctid) IN (SELECT c.t, c.c FROM c)
			AND (r.lease_until IS NULL OR r.lease_until < now())
		RETURNING ` + reportColumns("r.", 4)

// Release gives leased reports back, so the job's retry (or any job of the
// tenant) sends them without waiting for the lease to lapse.
func (s *Store) Release(ctx context.Context, reports []Report) error {
	if len(reports) == 0 {
		return nil
	}
	leads := make([]uuid.UUID, len(reports))
	dims := make([]string, len(reports))
	for i, r := range reports {
		leads[i], dims[i] = r.Lead, string(r.Dimension)
	}
	if err := s.customTx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, releaseSQL, leads, dims)
		return err
	}); err != nil {
		return fmt.Errorf("release reports: %w", err)
	}
	return nil
}

// HeldFor returns how long until the first lease on an open report of the
// tenant lapses, and false when no open report is leased. A job that finds
// nothing to claim while another holds a report — a job still running, or
// one killed mid-send — comes back then instead of completing.
func (s *Store) HeldFor(ctx context.Context, tenantID uuid.UUID) (time.Duration, bool, error) {
	var secs *float64
	if err := s.customTx(ctx, func(tx pgx.Tx) error { return tx.QueryRow(ctx, heldForSQL, tenantID).Scan(&secs) }); err != nil {
		return 0, false, fmt.Errorf("read leases of tenant %s: %w", tenantID, err)
	}
	if secs == nil {
		return 0, false, nil
	}
	return time.Duration(*secs * float64(time.Second)), true, nil
}

// heldForSQL is the seconds until the first lease on an open report of
// tenant $1 lapses.
const heldForSQL = `SELECT extract(epoch FROM min(lease_until) - now())::float8 FROM usage_reports
		WHERE tenant_id = $1 AND state = 'open' AND lease_until > now()`

// Accept records that Stripe holds the reports (or that they summed to
// zero), and in the same transaction stamps their members' dimensions
// accepted and bills every member whose dimensions with overage are all
// accepted. Reports of both dimensions of the same logs are best accepted
// together: each member is then written once. A report the sweep parked
// while its send was in flight is accepted too: Stripe has it. It returns
// how many member logs it wrote; accepting a report twice changes nothing
// the second time.
func (s *Store) Accept(ctx context.Context, reports ...Report) (int64, error) {
	if len(reports) == 0 {
		return 0, nil
	}
	var billed int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := planSettings(ctx, tx); err != nil {
			return err
		}
		members := acceptedMembers{}
		for _, r := range reports {
			var m []uuid.UUID
			err := tx.QueryRow(ctx, `UPDATE usage_reports SET state = 'accepted', accepted_at = now(), lease_until = NULL, message = NULL
				WHERE lead_usage_log_id = $1 AND dimension = $2 AND state IN ('open', 'needs_review')
				RETURNING member_ids`, r.Lead, string(r.Dimension)).Scan(&m)
			if errors.Is(err, pgx.ErrNoRows) {
				continue
			}
			if err != nil {
				return fmt.Errorf("accept report %s: %w", r.Key(), err)
			}
			members.add(r.Dimension, m)
		}
		var err error
		billed, err = acceptMembers(ctx, tx, members)
		return err
	})
	if err != nil {
		return 0, err
	}
	return billed, nil
}

// acceptedMembers are the member lists of accepted reports, per meter.
type acceptedMembers map[overage.Dimension][][]uuid.UUID

func (a acceptedMembers) add(meter overage.Dimension, members []uuid.UUID) {
	a[meter] = append(a[meter], members)
}

// acceptMembers stamps the accepted dimensions of the members (per
// dimension, the member lists of its accepted reports) and bills those now
// complete, one write per log, in one statement whatever their status: its
// counter triggers take the counter rows of every status it moves, sorted,
// once (migration 0020). Two statements, the logs under review then the
// pending ones, were the order of the per-row triggers before 0020; the
// first found no log in almost every call and still probed every id, a
// quarter of the acceptance's time (docs/benchmarks.md, "One acceptance
// statement").
func acceptMembers(ctx context.Context, tx pgx.Tx, members acceptedMembers) (int64, error) {
	type flag struct {
		in, out bool
		extra   []string
	}
	flags := map[uuid.UUID]*flag{}
	var ids []uuid.UUID
	for d, lists := range members {
		for _, l := range lists {
			for _, id := range l {
				f, ok := flags[id]
				if !ok {
					f = &flag{}
					flags[id] = f
					ids = append(ids, id)
				}
				switch d {
				case overage.DimensionInput:
					f.in = true
				case overage.DimensionOutput:
					f.out = true
				default:
					f.extra = append(f.extra, string(d))
				}
			}
		}
	}
	if len(ids) == 0 {
		return 0, nil
	}
	in, out := make([]bool, len(ids)), make([]bool, len(ids))
	// The accepted lines of other meters, per log: their keys joined by
	// commas (a key is [a-z0-9_]), NULL for none, so SQL need not group
	// (log, key) pairs, which spills to disk at batch sizes
	// (docs/benchmarks.md, "Measurements behind the code").
	extra := make([]*string, len(ids))
	for i, id := range ids {
		f := flags[id]
		in[i], out[i] = f.in, f.out
		if len(f.extra) > 0 {
			ks := strings.Join(f.extra, ",")
			extra[i] = &ks
		}
	}
	// A log is complete when every line with overage is accepted: the
	// defaults by their columns, the others element by element, counting
	// those this statement accepts (acc.keys), in one pass over a log's
	// meter lines (see acceptMembersSQL).
	tag, err := tx.Exec(ctx, acceptMembersSQL, ids, in, out, extra)
	if err != nil {
		return 0, fmt.Errorf("bill members: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Fail marks an open report failed with Stripe's message, and its pending
// members failed with it: nothing retrying can fix is retried.
func (s *Store) Fail(ctx context.Context, r Report, msg string) (int64, error) {
	return s.closeReport(ctx, r, ReportFailed, overage.BillingStatusFailed, msg, nil)
}

// Park moves an open report whose first send is past the guard's cutoff (by
// the database clock) to needs_review, and its pending members with it: a
// resend could be applied twice by Stripe. It returns how many logs moved;
// 0 when the report is not past the cutoff or no longer open.
func (s *Store) Park(ctx context.Context, r Report, g Guard) (int64, error) {
	return s.closeReport(ctx, r, ReportNeedsReview, overage.BillingStatusNeedsReview, "", &g)
}

// parkMessage says why a log waits for an operator, in the database's words.
const parkMessage = `format('first sent to Stripe at %s, longer ago than Stripe''s %s idempotency window allows for a safe resend; an operator must decide',
	to_char(first_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), $5::text)`

func (s *Store) closeReport(ctx context.Context, r Report, state ReportState, status overage.BillingStatus, msg string, g *Guard) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := planSettings(ctx, tx); err != nil {
			return err
		}
		cond, message := ``, `$4::text`
		args := []any{r.Lead, string(r.Dimension), string(state), msg}
		if g != nil {
			cond = ` AND first_attempt_at < now() - make_interval(secs => $6)`
			message = `coalesce(nullif($4::text, ''), ` + parkMessage + `)`
			args = append(args, g.Window.String(), g.Cutoff().Seconds())
		}
		var members []uuid.UUID
		var text string
		err := tx.QueryRow(ctx, `UPDATE usage_reports SET state = $3, lease_until = NULL, message = `+message+`
			WHERE lead_usage_log_id = $1 AND dimension = $2 AND state = 'open'`+cond+`
			RETURNING member_ids, message`, args...).Scan(&members, &text)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, closeMembersSQL, members, string(status), text)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("mark report %s %s: %w", r.Key(), state, err)
	}
	return n, nil
}

// ParkOpenTx moves, in tx, every open report of tenant that no live
// worker holds to needs_review with msg, and its pending members with it.
// Lifting a suspension calls it: those reports were formed, and sent at
// least once (the first attempt is committed with the report), for the
// customer Stripe deleted. Their resend would carry the same key to
// another customer — an idempotency error within Stripe's window — and
// whether the first send was applied is unknown, so an operator decides.
func ParkOpenTx(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, msg string) (int64, error) {
	tag, err := tx.Exec(ctx, `WITH parked AS (
			UPDATE usage_reports SET state = 'needs_review', lease_until = NULL, message = $2
			WHERE tenant_id = $1 AND state = 'open' AND (lease_until IS NULL OR lease_until < now())
			RETURNING member_ids)
		UPDATE usage_logs SET billing_status = 'needs_review', billing_message = $2, updated_at = now()
		WHERE tenant_id = $1 AND id IN (SELECT unnest(member_ids) FROM parked) AND billing_status = 'pending'`, tenantID, msg)
	if err != nil {
		return 0, fmt.Errorf("park the open reports of tenant %s: %w", tenantID, err)
	}
	return tag.RowsAffected(), nil
}

// ExpiredReports lists up to limit open reports, of any tenant, whose first
// send is past the guard's cutoff and that no live worker holds: the
// sweep parks them.
func (s *Store) ExpiredReports(ctx context.Context, g Guard, limit int) ([]Report, error) {
	var rs []Report
	err := s.customTx(ctx, func(tx pgx.Tx) (err error) {
		rs, err = collectReports(tx.Query(ctx, expiredReportsSQL, limit, g.Cutoff().Seconds()))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read reports past the window: %w", err)
	}
	return rs, nil
}

// expiredReportsSQL lists up to $1 open reports whose first send is more
// than $2 seconds old and that no live worker holds.
var expiredReportsSQL = `SELECT ` + reportColumns("", 2) + ` FROM usage_reports
		WHERE state = 'open' AND first_attempt_at < now() - make_interval(secs => $2)
			AND (lease_until IS NULL OR lease_until < now())
		LIMIT $1`

// TenantsPendingSince lists the tenants with a usage log pending for longer
// than grace: their report jobs are to be queued again. One probe of the
// (tenant_id, created_at) pending index per tenant. A suspended tenant is
// left out: its logs wait for the suspension to be lifted, which queues
// its job itself.
func (s *Store) TenantsPendingSince(ctx context.Context, grace time.Duration) ([]uuid.UUID, error) {
	rows, err := s.pool.Query(ctx, tenantsPendingSinceSQL, grace.Seconds())
	if err != nil {
		return nil, fmt.Errorf("read tenants with pending usage logs: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("read tenants with pending usage logs: %w", err)
	}
	return ids, nil
}

// releaseSQL gives back the open reports ($1 leads, $2 dimensions).
const releaseSQL = `UPDATE usage_reports r SET lease_until = NULL
		FROM unnest($1::uuid[], $2::text[]) AS v (lead, dim)
		WHERE r.lead_usage_log_id = v.lead AND r.dimension = v.dim AND r.state = 'open'`

// acceptMembersSQL stamps and bills the members ($1 ids, $2
// and $3 input and output accepted, $4 each log's accepted lines of other
// meters, their keys joined by commas, NULL for none; u.id = ANY($1)
// prunes and probes as formMembershipSQL's does). One pass over a
// log's meter lines (m) gives both its new meter_accepted_at and whether
// those lines are all accepted, and the completeness is decided once for
// the columns it sets, not per column (four scans of the lines a log;
// docs/benchmarks.md, "Meters", has what that cost). It leaves
// updated_at alone, as formation does: the accepted and billed times say
// when billing changed the log, and a fourth copy of that instant was 8
// bytes of every billed log (migration 0072). A log it bills that nothing
// else changed (updated_at NULL) is written without what it would hold
// twice (migration 0073): an accepted time equal to billed_at and an
// output lead equal to the input lead are NULL, which InputAcceptedAtSQL,
// OutputAcceptedAtSQL and OutputReportLeadSQL read back; a dimension an
// earlier report accepted keeps its own time (once: the log billed now,
// by billing alone). A log already so written is not stamped again (a.i,
// a.o): its NULL is a time, not a dimension waiting.
var acceptMembersSQL = func() string {
	done := `u.billing_status IN ('pending', 'needs_review')
		AND (` + OverageInputSQL("u") + ` = 0 OR a.i IS NOT NULL)
		AND (` + OverageOutputSQL("u") + ` = 0 OR a.o IS NOT NULL)
		AND coalesce(bool_and(x.o = 0 OR x.a IS NOT NULL OR x.k = ANY (coalesce(acc.keys, '{}'))), true)`
	once := `m.done AND u.updated_at IS NULL`
	return `UPDATE usage_logs u SET
				(input_accepted_at, output_accepted_at, output_report_lead,
				meter_accepted_at, billing_status, billed_at, billing_message) = (
					SELECT CASE WHEN ` + once + ` THEN nullif(a.i, now()) ELSE a.i END,
						CASE WHEN ` + once + ` THEN nullif(a.o, now()) ELSE a.o END,
						CASE WHEN ` + once + ` AND u.output_report_lead = u.input_report_lead THEN NULL ELSE u.output_report_lead END,
						CASE WHEN acc.keys IS NULL THEN u.meter_accepted_at ELSE m.accepted END,
						CASE WHEN m.done THEN 'billed' ELSE u.billing_status END,
						CASE WHEN m.done THEN now() ELSE u.billed_at END,
						CASE WHEN m.done THEN NULL ELSE u.billing_message END
					FROM (SELECT CASE WHEN v.i AND NOT ` + billedByAcceptanceSQL("u") + ` THEN coalesce(u.input_accepted_at, now()) ELSE u.input_accepted_at END AS i,
							CASE WHEN v.o AND NOT ` + billedByAcceptanceSQL("u") + ` THEN coalesce(u.output_accepted_at, now()) ELSE u.output_accepted_at END AS o) AS a
					CROSS JOIN LATERAL (
						SELECT array_agg(CASE WHEN x.k = ANY (acc.keys) THEN coalesce(x.a, now()) ELSE x.a END ORDER BY x.n) AS accepted,
							` + done + ` AS done
						FROM unnest(u.meter_keys, u.meter_overage, u.meter_accepted_at) WITH ORDINALITY AS x (k, o, a, n)) AS m)
			FROM unnest($1::uuid[], $2::bool[], $3::bool[], $4::text[]) AS v (id, i, o, ks)
				CROSS JOIN LATERAL (SELECT string_to_array(v.ks, ',') AS keys) AS acc
			WHERE u.id = v.id AND u.id = ANY($1)`
}()

// closeMembersSQL moves a closed report's pending members ($1) to $2 with
// message $3. Planned for its ids (a custom plan), id = ANY($1) is pruned
// to their partitions by itself; the status is tested as a test of the
// comparison (IS TRUE), not the comparison itself: "billing_status =
// 'pending'" is the predicate of the partial index of pending logs, and
// with the ids' condition beside it the planner, costing that index by
// its size alone on a partition never analysed (11,068 rows estimated,
// 3,392,305 read in the expiry run), ANDed a scan of the whole index with
// the primary key's probes: 6,918 pages a call to update 1,000 logs,
// 1.0 s against 0.3 s (docs/plans.md, "The bounds read the range
// between them"). As a filter it costs one comparison a log.
const closeMembersSQL = `UPDATE usage_logs SET billing_status = $2, billing_message = $3, updated_at = now()
			WHERE id = ANY($1) AND (billing_status = 'pending') IS TRUE`

// tenantsPendingSinceSQL lists the tenants not suspended with a log
// pending for longer than $1 seconds.
const tenantsPendingSinceSQL = `SELECT t.id FROM tenants t WHERE t.suspended_at IS NULL AND EXISTS (
		SELECT 1 FROM usage_logs u WHERE u.tenant_id = t.id AND u.billing_status = 'pending'
			AND u.created_at < now() - make_interval(secs => $1))`

// planSettingsSQL is the first statement of each transaction of the store:
// every statement after it is planned for its arguments and the tables as
// they are at each execution (a custom plan), never by a generic plan
// cached while the tables were small. A generic plan made at a few rows
// joins unnest($1) to usage_logs by hash over a sequential scan, and the
// next ANALYZE that would replace it may be a long way off; planning these
// statements again costs a fraction of a millisecond (docs/plans.md).
const planSettingsSQL = `SELECT set_config('plan_cache_mode', 'force_custom_plan', true)`

// indexPlansSQL opens a transaction whose statement walks one tenant's
// rows in a partial index and prunes nothing (lockCandidatesSQL,
// claimSQL): its generic plan, made once a connection, with only index
// scans to choose from. Planned anew at each execution, as planSettingsSQL
// has the others, the two spent longer planning than running (the lease
// of reports 3.5 s against 0.5 s in an end-to-end run). A generic plan
// alone is not enough: made while the tables were small, it scanned the
// tenant's 50,000 logs or 100,000 reports
// (TestReportStatementsReadOnlyWhatTheyAnswerAtAnyStatistics); with
// sequential and bitmap scans off, as ingest's transactions have them
// (ingest's txSettingsSQL), the walk in the index is the plan at any
// statistics. Their tenant_id is not the partition key, so a custom plan
// pruned nothing either. It reads the two settings it turns off, for
// customPlans to put back.
const indexPlansSQL = `SELECT o.seq, o.bitmap, set_config('plan_cache_mode', 'force_generic_plan', true),
		set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)
	FROM (SELECT current_setting('enable_seqscan') AS seq, current_setting('enable_bitmapscan') AS bitmap OFFSET 0) AS o`

// customPlansSQL ends indexPlansSQL's settings: custom plans again
// (planSettingsSQL's), and the two scans as they were ($1, $2).
const customPlansSQL = `SELECT set_config('plan_cache_mode', 'force_custom_plan', true),
	set_config('enable_seqscan', $1, true), set_config('enable_bitmapscan', $2, true)`

// indexPlans runs indexPlansSQL in tx; customPlans, once the walk is done,
// gives the statements after it planSettingsSQL's custom plans and the
// scans as they were.
func indexPlans(ctx context.Context, tx pgx.Tx) (customPlans func() error, err error) {
	var seq, bitmap string
	if err := tx.QueryRow(ctx, indexPlansSQL).Scan(&seq, &bitmap, nil, nil, nil); err != nil {
		return nil, fmt.Errorf("plan settings: %w", err)
	}
	return func() error {
		if _, err := tx.Exec(ctx, customPlansSQL, seq, bitmap); err != nil {
			return fmt.Errorf("plan settings: %w", err)
		}
		return nil
	}, nil
}

// customTx runs f in a transaction of the pool opened by planSettingsSQL.
func (s *Store) customTx(ctx context.Context, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := planSettings(ctx, tx); err != nil {
			return err
		}
		return f(tx)
	})
}

// planSettings runs planSettingsSQL in tx.
func planSettings(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, planSettingsSQL); err != nil {
		return fmt.Errorf("plan settings: %w", err)
	}
	return nil
}
