package ingest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/usagelog"
)

// The one ingest transaction. Every request that records usage — a single
// event, a coalesced group of them, a batch, a stream checkpoint, a
// correction — runs the same steps in one transaction on a pipeTx:
//
//  1. claim: BEGIN, the settings, each key's try-lock and its stored
//     record, queued first in the transaction's first pipeline (queueClaim,
//     scanClaim); the pipelined path queues its state reads behind them.
//  2. answer from the records (claim.answer): a live record is replayed or
//     refused as key reuse, a key whose lock is held is 409 in progress,
//     an expired record is replaced; the rest go on.
//  3. read the state and compute the effect: what differs between callers.
//     New events read their periods and totals in the first pipeline and
//     lock only the periods with allowance left (state.order); a delta log
//     (a checkpoint's increase, a correction) locks its periods and their
//     total rows (state.lockPeriods). Both split every meter line with
//     overage.Split against the running totals (state.split) into the same
//     writes (writes.add).
//  4. queue the report jobs and threshold alerts (Service.queueJobs).
//  5. commit (commit): the expired records' removal, the period totals,
//     the usage logs, the caller's own statements, the stored answers and
//     COMMIT, in one pipeline.
//
// So the rows of usage_logs, allowance_usage, meter_usage and
// idempotency_keys an ingest request adds are written by one function, in
// one order (migrations/0007), whatever the request.

// lockTimeout bounds how long one ingest transaction — and so the claim on
// its Idempotency-Key — may live: the context of every one, and the
// transaction's idle_in_transaction_session_timeout (txSettingsSQL).
const lockTimeout = 10 * time.Second

// beginSQL sets the transaction's settings (txSettingsSQL), names its slot
// for the counter triggers (see slots.go), and tries each member's key
// lock, in the members' order: one statement. $3 is the plan_cache_mode of
// the transaction (empty: the session's): the new events of readState
// make the transaction's prepared statements use their generic plan:
// they take arrays, for which PostgreSQL would otherwise plan every
// execution anew (docs/benchmarks.md, "Measurements behind the code").
var beginSQL = `SELECT ` + txSettingsSQL + `,
	set_config('plan_cache_mode', coalesce(nullif($3::text, ''), current_setting('plan_cache_mode')), true),
	set_config('overage.slot', $1::int::text, true),
	(SELECT array_agg(pg_try_advisory_xact_lock(l.k) ORDER BY l.o) FROM unnest($2::bigint[]) WITH ORDINALITY AS l (k, o))`

// claim is step 1's result: which keys' locks the transaction holds and
// their stored records.
type claim struct {
	locked []bool                    // per key, in queueClaim's order
	recs   map[string]storedResponse // the stored records, by key
	// expired holds the expired records of the keys that go on, to be
	// replaced in the commit.
	expired []expiredKey
	// recorded holds the logs of the live compact records (readRecorded).
	recorded map[uuid.UUID]*overage.UsageLog
}

// begin leases the transaction's slot and acquires its connection (its
// BEGIN goes with the claim: queueClaim). end rolls back what was not
// committed and gives both back, the slot once its rows are unlocked.
func (s *Service) begin(ctx context.Context) (tx *pipeTx, slot int16, end func(), err error) {
	slot = s.slots.take()
	if tx, err = beginPipeTx(ctx, s.pool); err != nil {
		s.slots.give(slot)
		return nil, 0, nil, fmt.Errorf("begin ingest transaction: %w", err)
	}
	return tx, slot, func() {
		tx.release(context.WithoutCancel(ctx))
		s.slots.give(slot)
	}, nil
}

// queueClaim queues BEGIN, the settings and the keys' locks and records:
// the first statements of every ingest transaction.
func queueClaim(b *pgx.Batch, tenantID uuid.UUID, keys []string, slot int16, planMode string) {
	locks := make([]int64, len(keys))
	for i, k := range keys {
		locks[i] = lockKey(tenantID, k)
	}
	b.Queue(`BEGIN`)
	b.Queue(beginSQL, slot, locks, planMode)
	b.Queue(idempotency.LookupSQL, pgUUID(tenantID), keys)
}

// scanClaim reads the results of queueClaim's statements for n keys.
func scanClaim(br pgx.BatchResults, n int) (*claim, error) {
	c := &claim{recs: map[string]storedResponse{}}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("begin ingest transaction: %w", err)
	}
	settings := make([]any, txSettingsColumns+2, txSettingsColumns+3)
	if err := br.QueryRow().Scan(append(settings, &c.locked)...); err != nil {
		return nil, fmt.Errorf("take idempotency locks: %w", err)
	}
	if len(c.locked) != n {
		return nil, fmt.Errorf("take idempotency locks: %d answers for %d keys", len(c.locked), n)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("read idempotency records: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var rec storedResponse
		if err := rows.Scan(&key, &rec.fingerprint, &rec.status, &rec.body, &rec.usageLogID, &rec.expiresAt, &rec.expired); err != nil {
			return nil, fmt.Errorf("read idempotency records: %w", err)
		}
		c.recs[key] = rec
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read idempotency records: %w", err)
	}
	return c, nil
}

// readRecorded reads, and presents with cat (or a newer catalog when they
// name a meter it lacks), the logs of the live compact records, whose
// answers are rendered from them.
func (s *Service) readRecorded(ctx context.Context, tx *pipeTx, c *claim, cat *overage.Catalog,
	earlier map[string]*overage.UsageLog) error {
	var err error
	if c.recorded, err = readRecordedLogs(ctx, tx, c.recs); err != nil {
		return err
	}
	return s.presentAll(ctx, tx, cat, c.recorded, earlier)
}

// answer is step 2 for the i-th key: its stored answer (a replay or a
// refusal), 409 in progress, or goes true: the transaction executes the
// request, replacing its expired record if it had one.
func (c *claim) answer(i int, key string, fp []byte) (out *Outcome, err error, goes bool) {
	rec, found := c.recs[key]
	switch {
	case found && !rec.expired:
		out, err = rec.replay(fp, c.recorded)
		return out, err, false
	case !c.locked[i]:
		return nil, errInProgress(), false
	}
	if found { // expired: the key starts a new request
		c.expired = append(c.expired, expiredKey{key, rec.expiresAt})
	}
	return nil, nil, true
}

// claimOne is steps 1 and 2 for a request on its own under one key (a
// correction, a checkpoint): the claim in a pipeline of its own. A non-nil
// Outcome or error is the answer; else the transaction holds the key.
func (s *Service) claimOne(ctx context.Context, tx *pipeTx, tenantID uuid.UUID, key string, fp []byte, slot int16) (*claim, *Outcome, error) {
	b := &pgx.Batch{}
	queueClaim(b, tenantID, []string{key}, slot, "")
	br := tx.SendBatch(ctx, b)
	c, err := scanClaim(br, 1)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("claim idempotency key: %w", cerr)
	}
	if err != nil {
		return nil, nil, err
	}
	if c.recorded, err = readRecordedLogs(ctx, tx, c.recs); err != nil {
		return nil, nil, err
	}
	if len(c.recorded) > 0 {
		logs := make([]*overage.UsageLog, 0, len(c.recorded))
		for _, l := range c.recorded {
			logs = append(logs, l)
		}
		if err := s.present(ctx, tx, logs...); err != nil {
			return nil, nil, err
		}
	}
	out, err, goes := c.answer(0, key, fp)
	if !goes {
		return nil, out, err
	}
	return c, nil, nil
}

// storedAnswer is an answer to store under its key in the commit.
type storedAnswer struct {
	key         string
	fingerprint []byte
	out         *Outcome
}

// commit is step 5: in one round trip, the expired records' removal, the
// used-up guard of the unordered periods (queueUsedUpGuard), the period
// totals (slot 0 of an ordered period, else the transaction's slot), the
// usage logs (insert, Service.insertSQL's, in request_id order, so two
// batches sharing request_ids wait for each other instead of
// deadlocking), the statements of w.after, the stored answers, COMMIT.
func commit(ctx context.Context, tx *pipeTx, tenantID uuid.UUID, st *state, c *claim, w *writes, answers []storedAnswer, insert string) error {
	b := &pgx.Batch{}
	for _, e := range c.expired {
		b.Queue(idempotency.DeleteExpiredSQL, pgUUID(tenantID), e.key, e.expiresAt)
	}
	if len(w.logs) > 0 {
		queueUsedUpGuard(b, tenantID, st, w.deltaOrder, w.deltas, w.extra)
		queueAllowanceTotals(b, tenantID, st, w)
		if len(w.extra) > 0 {
			queueMeterTotals(b, tenantID, st, w.extra)
		}
		w.queueLogs(b, tenantID, st.now, insert)
	}
	if w.after != nil {
		w.after(b)
	}
	n := len(answers)
	keys, fps, statuses, bodies, logIDs := make(pgArray[pgString], n), make([][]byte, n), make([]int32, n), make([][]byte, n), make(pgArray[pgtype.UUID], n)
	for i, a := range answers {
		keys[i], fps[i], statuses[i], bodies[i], logIDs[i] = pgString(a.key), a.fingerprint, int32(a.out.Status), a.out.Body, nullID(a.out.UsageLogID)
		if a.out.stored != nil {
			bodies[i] = a.out.stored
		}
	}
	b.Queue(idempotency.InsertSQL, pgUUID(tenantID), keys, fps, statuses, bodies, logIDs, KeyTTL.Seconds())
	b.Queue(`COMMIT`)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "22012" /* division_by_zero: the guard */ {
			return errAllowanceGivenBack
		}
		return fmt.Errorf("write usage logs and idempotency record, commit: %w", err)
	}
	tx.commitQueued()
	return nil
}

// queueLogs queues the insert of w's logs created at now with insert
// (usagelog.InsertSQL or InsertOverageSQL).
func (w *writes) queueLogs(b *pgx.Batch, tenantID uuid.UUID, now time.Time, insert string) {
	m := len(w.logs)
	ids, rids := make(pgArray[pgtype.UUID], m), make(pgArray[pgtype.Text], m)
	tss, periods := make(pgArray[pgTimestamptz], m), make(pgArray[pgTimestamptz], m)
	users, models, statuses := make(pgArray[pgString], m), make(pgArray[pgString], m), make(pgArray[pgString], m)
	in, out, oin, oout := make(pgArray[pgInt8], m), make(pgArray[pgInt8], m), make(pgArray[pgInt8], m), make(pgArray[pgInt8], m)
	// The rare columns are NULL arrays (one argument each) unless some log
	// of the transaction has one: the parts, a log of a period closed
	// now (reported at send time, whenever its report is formed: closed
	// is for good), and a delta log's correction and stream columns.
	var reads, writes, reasons []*int64
	var reported []bool
	var corrects []*uuid.UUID
	var why, by []*string
	flat := newFlatLines(w.lines)
	for i, l := range w.logs {
		flat.add(w.lines[i])
		ids[i], tss[i], periods[i] = pgUUID(l.ID), pgTimestamptz(l.Timestamp), pgTimestamptz(w.periods[i])
		if l.RequestID != nil {
			rids[i] = pgtype.Text{String: *l.RequestID, Valid: true}
		}
		users[i], models[i], statuses[i] = pgString(l.UserID), pgString(l.ModelID), pgString(l.BillingStatus)
		in[i], out[i] = pgInt8(l.InputTokens), pgInt8(l.OutputTokens)
		oin[i], oout[i] = pgInt8(w.lines[i][0].Overage), pgInt8(w.lines[i][1].Overage)
		if l.TokenParts != (overage.TokenParts{}) && reads == nil {
			reads, writes, reasons = make([]*int64, m), make([]*int64, m), make([]*int64, m)
		}
		if reads != nil {
			reads[i], writes[i], reasons[i] = l.CacheRead, l.CacheWrite, l.Reasoning
		}
		if l.StripeTimestamp == usagelog.TimestampReported && reported == nil {
			reported = make([]bool, m)
		}
		if reported != nil {
			reported[i] = l.StripeTimestamp == usagelog.TimestampReported
		}
		if (l.Corrects != nil || l.CorrectedBy != nil) && corrects == nil {
			corrects, why, by = make([]*uuid.UUID, m), make([]*string, m), make([]*string, m)
		}
		if corrects != nil {
			corrects[i], why[i], by[i] = l.Corrects, l.Reason, l.CorrectedBy
		}
	}
	if slices.ContainsFunc(rids, func(r pgtype.Text) bool { return r.Valid }) {
		b.Queue(usagelog.ClaimRequestIDsSQL, pgUUID(tenantID), rids)
	}
	b.Queue(insert,
		pgUUID(tenantID), ids, rids, tss, users, models, in, out, periods, oin, oout, statuses, now, reads, writes, reasons,
		flat.keys, flat.tokens, flat.over, flat.offsets, flat.count, reported, corrects, why, w.streamRIDs, by)
}

// deltaEffect is what a request of its own (a correction, a checkpoint)
// decided to record in its transaction: its delta logs, how its answer is
// rendered once their overage is computed, and its own statements to
// write with them.
type deltaEffect struct {
	catalog *overage.Catalog // the logs are presented with (nil: no logs)
	logs    []*deltaLog
	render  func() (*Outcome, error)
	after   func(b *pgx.Batch)
}

// executeDelta runs a request of its own under one key as the one ingest
// transaction: the claim (a replay, a refusal, or the key held), decide's
// reads and decision, the delta logs split under their periods' locks,
// the report jobs and the commit with the stored answer.
//
// The transaction writes the counter rows of a leased slot (see
// slots.go): a slot no other transaction holds, so its counter rows never
// make it wait for, or deadlock with, a report worker that holds the
// usage log it corrects.
func (s *Service) executeDelta(ctx context.Context, tenantID uuid.UUID, key string, fp []byte,
	decide func(context.Context, *pipeTx) (*deltaEffect, error)) (*Outcome, error) {
	insert, err := s.insertSQL(ctx)
	if err != nil {
		return nil, err
	}
	tx, slot, end, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	c, out, err := s.claimOne(ctx, tx, tenantID, key, fp, slot)
	if out != nil || err != nil {
		return out, err
	}
	eff, err := decide(ctx, tx)
	if err != nil {
		return nil, err
	}
	st := newState(slot, eff.catalog)
	w, err := st.deltaWrites(ctx, tx, tenantID, eff.logs)
	if err != nil {
		return nil, err
	}
	if len(w.logs) > 0 {
		if err := s.queueJobs(ctx, tx, tenantID, st, w); err != nil {
			return nil, err
		}
	}
	if out, err = eff.render(); err != nil {
		return nil, err
	}
	w.after = eff.after
	if err := commit(ctx, tx, tenantID, st, c, w, []storedAnswer{{key: key, fingerprint: fp, out: out}}, insert); err != nil {
		return nil, err
	}
	return out, nil
}

// deltaWrites orders the delta logs with every ingest event of their
// periods that still sees allowance left (the same advisory locks) and
// after every writer of the periods' total rows that has written them
// (their row locks), reads each of their meters' period total T and
// splits each line with overage.Split(T, d, A) (state.split).
func (st *state) deltaWrites(ctx context.Context, tx *pipeTx, tenantID uuid.UUID, logs []*deltaLog) (*writes, error) {
	w := newWrites(len(logs))
	if len(logs) == 0 {
		return w, nil
	}
	var periods []time.Time
	var meters []string
	for _, d := range logs {
		if !slices.Contains(periods, d.period) {
			periods = append(periods, d.period)
		}
		for _, ln := range d.lines[2:] {
			if !slices.Contains(meters, ln.Meter) {
				meters = append(meters, ln.Meter)
			}
		}
	}
	if err := st.lockPeriods(ctx, tx, tenantID, periods, periodLocks{meters: meters, rows: true, tenant: true}); err != nil {
		return nil, err
	}
	for _, d := range logs {
		lines, err := st.split(d.period, d.lines)
		if err != nil {
			return nil, err
		}
		d.log.CreatedAt = st.now
		st.finish(d.log, lines)
		w.add(d.log, d.period, lines)
		if d.streamRID != nil && w.streamRIDs == nil {
			w.streamRIDs = make([]*string, len(logs))
		}
		if w.streamRIDs != nil {
			w.streamRIDs[len(w.logs)-1] = d.streamRID
		}
	}
	return w, nil
}
