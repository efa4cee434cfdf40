package usagelog

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/overage-billing/overage"
)

// FormParams forms the next reports of a tenant.
type FormParams struct {
	TenantID uuid.UUID
	// MaxLogs bounds the usage logs gathered by one call (REPORT_BATCH_MAX);
	// a report never has more members.
	MaxLogs int
	Lease   time.Duration
	Guard   Guard
	// CloseGrace is PERIOD_CLOSE_GRACE (DefaultPeriodCloseGrace when 0):
	// the logs of a period closed at formation (PeriodClosedSQL) form
	// reports of their own, timestamped with the formation time.
	CloseGrace time.Duration
}

// maxSingleLogReports bounds the per-log reports one call forms for logs
// first sent before reports existed (see Form).
const maxSingleLogReports = 100

type candidate struct {
	id              uuid.UUID
	ts, period      time.Time
	overage         map[overage.Dimension]int64
	need            []overage.Dimension
	firstAttemptAt  *time.Time
	singleLogReport bool
	// reported: ingest found its period closed and answered "reported"
	// (stripe_timestamp), so it is reported at send time whatever the
	// period's state by this process's PERIOD_CLOSE_GRACE.
	reported bool
	// The lines of meters other than the defaults (see migrations/0031):
	// their keys and report leads, element by element.
	extraKeys  []string
	extraLeads []*uuid.UUID
}

type groupKey struct {
	d      overage.Dimension
	period time.Time
	day    time.Time
	// single is the log of a report of its own, else uuid.Nil.
	single uuid.UUID
	// late: the period was closed when the report was formed; the
	// report's timestamp is then the formation time (TimestampReported).
	// Its logs are still grouped by the UTC day of their usage, as every
	// report's are, so a report never mixes two days' usage.
	late bool
}

// Form gathers the tenant's oldest pending usage logs that are in no report
// yet for a dimension with overage — at most MaxLogs of them, locked with
// FOR UPDATE SKIP LOCKED so two jobs of one tenant never take the same log —
// and forms one report per (dimension, allowance period, UTC day), in one
// transaction committed before anything is sent. The lead of each report is
// its oldest member. A report summing to zero is accepted at once (nothing
// is owed, nothing is sent). It returns the open reports, leased to the
// caller; none when nothing is left to form.
//
// A log whose first send happened before reports existed (first_attempt_at
// set, in no report) forms a report of its own: its lead is itself, so the
// report carries exactly the key and value of that earlier send and Stripe
// deduplicates it, and the window counts from that first attempt.
//
// The logs of a period closed at formation (PeriodClosedSQL) are still
// counted in their own period, but form reports of their own, apart from
// in-period logs, whose timestamp is the formation time (the transaction's
// now()), so Stripe bills them on the invoice it still takes; each member
// records which applies in stripe_timestamp. Decided once, here: every
// resend carries the same timestamp.
func (s *Store) Form(ctx context.Context, p FormParams) ([]Report, error) {
	var out []Report
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		customPlans, err := indexPlans(ctx, tx)
		if err != nil {
			return err
		}
		cands, err := lockCandidates(ctx, tx, p.TenantID, p.MaxLogs)
		if err != nil || len(cands) == 0 {
			return err
		}
		if err := customPlans(); err != nil {
			return err
		}
		now, closed, err := closedPeriods(ctx, tx, p, cands)
		if err != nil {
			return err
		}
		groups := map[groupKey][]*candidate{}
		var order []groupKey
		singles := 0
		for _, c := range cands {
			if c.singleLogReport {
				if singles >= maxSingleLogReports {
					continue // left for the next call
				}
				singles++
			}
			for _, d := range c.need {
				k := groupKey{d: d, period: c.period, day: c.ts.UTC().Truncate(24 * time.Hour)}
				if c.singleLogReport {
					// Its earlier send carried its usage timestamp: so does
					// the report that repeats it.
					k.single = c.id
				} else if c.reported || closed[c.period] {
					k.late = true
				}
				if _, ok := groups[k]; !ok {
					order = append(order, k)
				}
				groups[k] = append(groups[k], c)
			}
		}
		leads := map[uuid.UUID]*[2]*uuid.UUID{}
		byID := map[uuid.UUID]*candidate{}
		late := map[uuid.UUID]bool{}
		var ids []uuid.UUID
		for _, k := range order {
			r, err := insertReport(ctx, tx, p, k, groups[k], now)
			if err != nil {
				return err
			}
			lead := r.Lead
			for _, c := range groups[k] {
				late[c.id] = late[c.id] || k.late
				l, ok := leads[c.id]
				if !ok {
					l = &[2]*uuid.UUID{}
					leads[c.id] = l
					byID[c.id] = c
					ids = append(ids, c.id)
				}
				switch k.d {
				case overage.DimensionInput:
					l[0] = &lead
				case overage.DimensionOutput:
					l[1] = &lead
				default:
					for i, key := range c.extraKeys {
						if key == string(k.d) {
							c.extraLeads[i] = &lead
						}
					}
				}
			}
			out = append(out, r)
		}
		in, outLeads := make([]*uuid.UUID, len(ids)), make([]*uuid.UUID, len(ids))
		// Each log's whole meter_leads array, flat: offsets and counts.
		var flat []*uuid.UUID
		offs, counts := make([]int32, len(ids)), make([]int32, len(ids))
		basis := make([]string, len(ids))
		for i, id := range ids {
			in[i], outLeads[i] = leads[id][0], leads[id][1]
			basis[i] = TimestampUsage
			if late[id] {
				basis[i] = TimestampReported
			}
			c := byID[id]
			offs[i], counts[i] = int32(len(flat)), int32(len(c.extraKeys))
			flat = append(flat, c.extraLeads...)
		}
		if _, err := tx.Exec(ctx, formMembershipSQL, ids, in, outLeads, flat, offs, counts, basis); err != nil {
			return fmt.Errorf("record report membership: %w", err)
		}
		open := out[:0]
		zero := acceptedMembers{}
		for _, r := range out {
			if r.State == ReportAccepted {
				zero.add(r.Dimension, r.Members)
				continue
			}
			open = append(open, r)
		}
		out = open
		_, err = acceptMembers(ctx, tx, zero)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("form reports of tenant %s: %w", p.TenantID, err)
	}
	return out, nil
}

// formMembershipSQL records, per log, the reports it joined ($1 ids, $2 and
// $3 the input and output leads, $4 the meter leads flat with $5 offsets and
// $6 counts, $7 the basis of each log's Stripe timestamp; updated_at is
// left alone, first_attempt_at says when, migration 0072). u.id = ANY($1)
// beside the join: planned for its ids (a custom plan), it is both the
// pruning to their partitions (the planner prunes by no join) and an
// index condition on exactly those ids. Bounds (u.id BETWEEN the least
// and the greatest id) pruned as well, but let the planner read the whole
// range between them: a tenant's oldest pending logs span every tenant's
// logs ingested meanwhile, so at a backlog of millions a call read
// hundreds of thousands of rows to update thousands, and billing fell
// behind further (docs/plans.md, "Partitions a statement reads").
const formMembershipSQL = `UPDATE usage_logs u SET
				input_report_lead = coalesce(v.inl, u.input_report_lead),
				output_report_lead = coalesce(v.outl, u.output_report_lead),
				meter_leads = CASE WHEN v.cnt > 0 THEN ($4::uuid[])[v.off + 1 : v.off + v.cnt] ELSE u.meter_leads END,
				first_attempt_at = coalesce(u.first_attempt_at, now()),
				stripe_timestamp = CASE WHEN v.basis = 'reported' THEN v.basis ELSE coalesce(u.stripe_timestamp, v.basis) END
			FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $5::int[], $6::int[], $7::text[]) AS v (id, inl, outl, off, cnt, basis)
			WHERE u.id = v.id AND u.id = ANY($1)`

// The dimensions of a log in no report yet, not accepted, with overage.
// Bare columns: a pending log is never written with 0073's NULLs.
var needIn = `(` + OverageInputSQL("") + ` <> 0 AND input_report_lead IS NULL AND input_accepted_at IS NULL)`
var needOut = `(` + OverageOutputSQL("") + ` <> 0 AND output_report_lead IS NULL AND output_accepted_at IS NULL)`

// A line of another meter with overage, in no report, not accepted.
const needExtra = `(meter_keys IS NOT NULL AND EXISTS (
		SELECT 1 FROM unnest(meter_overage, meter_leads, meter_accepted_at) AS x (o, l, a)
		WHERE x.o <> 0 AND x.l IS NULL AND x.a IS NULL))`

// lockCandidatesSQL reads and locks up to $2 candidates of tenant $1.
var lockCandidatesSQL = `SELECT id, ts, period_start, ` + OverageInputSQL("") + `, ` + OverageOutputSQL("") + `, ` + needIn + `, ` + needOut + `,
			first_attempt_at, first_attempt_at IS NOT NULL AND input_report_lead IS NULL AND output_report_lead IS NULL AND meter_leads IS NULL,
			meter_keys, meter_overage, meter_leads, meter_accepted_at, coalesce(stripe_timestamp = 'reported', false)
		FROM usage_logs
		WHERE tenant_id = $1 AND billing_status = 'pending' AND (` + needIn + ` OR ` + needOut + ` OR ` + needExtra + `)
		ORDER BY created_at LIMIT $2
		FOR UPDATE SKIP LOCKED`

// lockCandidates reads and locks the tenant's oldest pending logs with a
// dimension in no report yet, walking the (tenant_id, created_at) pending
// index in its order (no sort: a tie on created_at, as a bulk insert makes,
// would otherwise sort every pending log of the tenant at each call). Logs
// another transaction holds are skipped, not waited for.
func lockCandidates(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, limit int) ([]*candidate, error) {
	rows, err := tx.Query(ctx, lockCandidatesSQL, tenantID, limit)
	if err != nil {
		return nil, fmt.Errorf("lock pending usage logs: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (*candidate, error) {
		c := &candidate{overage: map[overage.Dimension]int64{}}
		var in, out bool
		var oin, oout int64
		var over []int64
		var leads []pgtype.UUID
		var accepted []pgtype.Timestamptz
		err := row.Scan(&c.id, &c.ts, &c.period, &oin, &oout, &in, &out, &c.firstAttemptAt, &c.singleLogReport,
			&c.extraKeys, &over, &leads, &accepted, &c.reported)
		if err != nil {
			return nil, err
		}
		c.overage[overage.DimensionInput], c.overage[overage.DimensionOutput] = oin, oout
		if in {
			c.need = append(c.need, overage.DimensionInput)
		}
		if out {
			c.need = append(c.need, overage.DimensionOutput)
		}
		c.extraLeads = make([]*uuid.UUID, len(c.extraKeys))
		for i, k := range c.extraKeys {
			if i < len(leads) && leads[i].Valid {
				id := uuid.UUID(leads[i].Bytes)
				c.extraLeads[i] = &id
			}
			if i >= len(over) {
				return nil, fmt.Errorf("usage log %s: %d meter keys, %d overages", c.id, len(c.extraKeys), len(over))
			}
			c.overage[overage.Dimension(k)] += over[i]
			done := i < len(accepted) && accepted[i].Valid
			if over[i] != 0 && c.extraLeads[i] == nil && !done {
				c.need = append(c.need, overage.Dimension(k))
			}
		}
		c.ts, c.period = c.ts.UTC(), c.period.UTC()
		return c, nil
	})
}

// closedPeriods reads the transaction's now() and which of the candidates'
// periods are closed then.
func closedPeriods(ctx context.Context, tx pgx.Tx, p FormParams, cands []*candidate) (time.Time, map[time.Time]bool, error) {
	seen := map[time.Time]bool{}
	var periods []time.Time
	for _, c := range cands {
		if !seen[c.period] {
			seen[c.period] = true
			periods = append(periods, c.period)
		}
	}
	grace := p.CloseGrace
	if grace <= 0 {
		grace = DefaultPeriodCloseGrace
	}
	rows, err := tx.Query(ctx, `SELECT now(), v.p, `+PeriodClosedSQL("$1", "v.p", "$3")+`
		FROM unnest($2::timestamptz[]) AS v (p)`, p.TenantID, periods, grace.Seconds())
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("read closed periods: %w", err)
	}
	defer rows.Close()
	var now time.Time
	closed := map[time.Time]bool{}
	for rows.Next() {
		var period time.Time
		var isClosed bool
		if err := rows.Scan(&now, &period, &isClosed); err != nil {
			return time.Time{}, nil, fmt.Errorf("read closed periods: %w", err)
		}
		closed[period.UTC()] = isClosed
	}
	if err := rows.Err(); err != nil {
		return time.Time{}, nil, fmt.Errorf("read closed periods: %w", err)
	}
	return now.UTC(), closed, nil
}

func insertReport(ctx context.Context, tx pgx.Tx, p FormParams, k groupKey, members []*candidate, now time.Time) (Report, error) {
	r := Report{Lead: members[0].id, Dimension: k.d, TenantID: p.TenantID, State: ReportOpen}
	var first *time.Time
	for _, c := range members {
		r.Members = append(r.Members, c.id)
		r.Value += c.overage[k.d]
		if c.ts.After(r.Timestamp) {
			r.Timestamp = c.ts
		}
		if c.singleLogReport {
			first = c.firstAttemptAt
		}
	}
	if k.late {
		r.Timestamp = now
	}
	r.Timestamp = r.Timestamp.UTC()
	if r.Value == 0 {
		r.State = ReportAccepted
	}
	var remaining float64
	err := tx.QueryRow(ctx, `INSERT INTO usage_reports (lead_usage_log_id, dimension, tenant_id, period_start, usage_day, value, ts,
			member_ids, state, first_attempt_at, lease_until, accepted_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, coalesce($10, now()),
			CASE WHEN $9 = 'open' THEN now() + make_interval(secs => $11) END, CASE WHEN $9 = 'accepted' THEN now() END)
		RETURNING first_attempt_at, extract(epoch FROM first_attempt_at + make_interval(secs => $12) - now())::float8`,
		r.Lead, string(k.d), p.TenantID, k.period, k.day, r.Value, r.Timestamp, r.Members, string(r.State), first,
		p.Lease.Seconds(), p.Guard.Cutoff().Seconds()).Scan(&r.FirstAttemptAt, &remaining)
	if err != nil {
		return r, fmt.Errorf("insert report %s: %w", r.Key(), err)
	}
	r.FirstAttemptAt = r.FirstAttemptAt.UTC()
	r.Remaining = time.Duration(remaining * float64(time.Second))
	return r, nil
}
