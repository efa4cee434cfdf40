package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/alerts"
	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/internal/dberr"
	"github.com/overage-billing/overage/internal/fastjson"
	"github.com/overage-billing/overage/meters"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/usagelog"
)

// KeyTTL is how long an idempotency record is kept and replayed. It is
// advertised in the README and api/openapi.yaml (24 hours; a development
// build may compress it, idempotency/layout_dev.go).
var KeyTTL = idempotency.TTL

// retryAfterInProgress is the Retry-After of a 409 in progress: an ingest
// transaction takes milliseconds, so one second is ample.
const retryAfterInProgress = time.Second

// errInProgress answers a request whose key another request is executing.
func errInProgress() error {
	return &overage.Error{
		Code: overage.ECONFLICT, Type: "idempotency-key-in-progress",
		Message:    "a request with this Idempotency-Key is still being processed; retry after the Retry-After delay",
		RetryAfter: retryAfterInProgress,
	}
}

// Service records usage events.
type Service struct {
	pool   *pgxpool.Pool
	outbox *outbox.Inserter
	slots  *slotLeases
	// alerts records threshold events in the transactions that cross
	// them; nil records none.
	alerts *alerts.Recorder
	// meters is the catalog usage is routed with.
	meters *meters.Store

	// coalesce groups a tenant's concurrent single events into one
	// transaction; nil records each in its own.
	coalesce *coalescer
	// periodCloseGrace is PERIOD_CLOSE_GRACE (see correction.go).
	periodCloseGrace time.Duration
	// logInsert is the statement usage logs are written with, chosen at
	// the first write (insertSQL).
	logInsert atomic.Pointer[string]

	// beforeWrites, set only by tests, runs inside the ingest transaction
	// after its reads and report jobs, before its writes and commit; an
	// error aborts the transaction.
	beforeWrites func(ctx context.Context) error
	// onGroup, set only by tests, is told the size of every coalesced
	// group as it starts.
	onGroup func(members int)
}

// NewService returns a Service writing to pool and queueing with ob. It
// coalesces concurrent single events of a tenant (see group.go).
func NewService(pool *pgxpool.Pool, ob *outbox.Inserter) *Service {
	s := &Service{pool: pool, outbox: ob, slots: newSlotLeases(),
		meters: meters.NewStore(pool, overage.DefaultMeterInputEvent, overage.DefaultMeterOutputEvent)}
	s.coalesce = newCoalescer(s, defaultGroupsInFlight, maxGroupEvents)
	return s
}

// insertSQL is the statement the service writes usage logs with:
// usagelog.InsertSQL, storing an overage equal to its tokens NULL, on a
// database that takes it (0069), else usagelog.InsertOverageSQL. It is
// read once, at the first write, so a service started before the
// migration goes on writing what its schema took.
func (s *Service) insertSQL(ctx context.Context) (string, error) {
	if q := s.logInsert.Load(); q != nil {
		return *q, nil
	}
	var null bool
	if err := s.pool.QueryRow(ctx, usagelog.OverageNullSQL).Scan(&null); err != nil {
		return "", fmt.Errorf("read whether usage_logs takes an overage NULL: %w", err)
	}
	q := usagelog.InsertOverageSQL
	if null {
		q = usagelog.InsertSQL
	}
	s.logInsert.Store(&q)
	return q, nil
}

// UseMeters routes usage with the catalog of store (whose default meters
// carry the process's STRIPE_METER_*_EVENT names).
func (s *Service) UseMeters(store *meters.Store) { s.meters = store }

// DefaultGroupsInFlight is how many transactions of one tenant run at once
// before its single events wait to be coalesced (INGEST_COALESCE).
const DefaultGroupsInFlight = defaultGroupsInFlight

// SetCoalescing lets inFlight transactions of one tenant run at once before
// its single events are coalesced; 0 records every single event in its own
// transaction, as before group commit (INGEST_COALESCE=0, for comparison).
func (s *Service) SetCoalescing(inFlight int) {
	s.coalesce = nil
	if inFlight > 0 {
		s.coalesce = newCoalescer(s, inFlight, maxGroupEvents)
	}
}

// SetAlerts makes the ingest transactions record the threshold events
// they cross with r (nil: none).
func (s *Service) SetAlerts(r *alerts.Recorder) { s.alerts = r }

// Alerts is the Recorder SetAlerts set, or nil.
func (s *Service) Alerts() *alerts.Recorder { return s.alerts }

// Outcome is the response to send for a usage event.
type Outcome struct {
	Status int
	Body   []byte
	// Kind is "new", "duplicate" or "replay", for logs and metrics.
	Kind string
	// UsageLogID is the usage log the answer is about.
	UsageLogID uuid.UUID
	// stored, when not nil, is what is stored under the key instead of
	// Body: the answer's compact form (see storedResponse.compact).
	stored []byte
	// pooled: Body is a buffer of answerBufs, which release gives back.
	pooled bool
}

// answerBufs holds batch answers' buffers once written, for the next
// batch's answer. An answer of 1,000 logs is 0.85 MB with the default
// meters and 1.37 MB with three more (five meter lines a log): allocated
// anew, it was half of what serve allocated a batch, and the runtime
// zeroes every such allocation (docs/benchmarks.md, "Meters").
var answerBufs sync.Pool // of *[]byte

// takeAnswerBuf is an empty buffer of about size bytes or more: a kept one
// when it is large enough, else a new one (a kept one too small is left to
// the collector, so the buffers kept grow to the answers made).
func takeAnswerBuf(size int) []byte {
	if p, _ := answerBufs.Get().(*[]byte); p != nil && cap(*p) >= size {
		return (*p)[:0]
	}
	return make([]byte, 0, size)
}

// release gives a pooled answer's buffer back once the answer is written
// (an http.ResponseWriter keeps nothing of what it wrote); out must not be
// used after. An answer that is not released is simply collected.
func (out *Outcome) release() {
	if out == nil || !out.pooled {
		return
	}
	b := out.Body[:0]
	out.Body, out.pooled = nil, false
	answerBufs.Put(&b)
}

// Outcome kinds.
const (
	OutcomeNew       = "new"
	OutcomeDuplicate = "duplicate"
	OutcomeReplay    = "replay"
)

// RecordParams are the inputs of Record, all validated by the caller.
type RecordParams struct {
	TenantID uuid.UUID
	// KeyID is the API key that sent the event: a stream's final
	// checkpoint that lowers its totals records it as corrected_by.
	KeyID       uuid.UUID
	Key         string
	Fingerprint []byte
	Event       *Event
}

// BatchParams are the inputs of RecordBatch, all validated by the caller:
// 1 to MaxBatchEvents events, each with a request_id unique in the batch.
type BatchParams struct {
	TenantID    uuid.UUID
	Key         string
	Fingerprint []byte
	Events      []*Event
}

// Record executes a usage event under its idempotency key; see the package
// documentation for the protocol.
func (s *Service) Record(ctx context.Context, p RecordParams) (*Outcome, error) {
	m := &groupMember{key: p.Key, fingerprint: p.Fingerprint, events: []*Event{p.Event}, render: renderSingle}
	if s.coalesce != nil {
		return s.coalesce.record(ctx, p.TenantID, m)
	}
	return s.execute(ctx, p.TenantID, m)
}

// RecordBatch executes a batch of usage events under one idempotency key,
// all in one transaction: every new event is recorded, every request_id
// the tenant already recorded is answered with its log, and the whole
// answer is stored under the key.
func (s *Service) RecordBatch(ctx context.Context, p BatchParams) (*Outcome, error) {
	return s.execute(ctx, p.TenantID, &groupMember{key: p.Key, fingerprint: p.Fingerprint, events: p.Events, render: renderBatch})
}

// groupMember is one request of an ingest transaction: its key, its events and
// how its answer is rendered.
type groupMember struct {
	key         string
	fingerprint []byte
	events      []*Event
	render      renderer
	first       int // index of its first event in its group's events
}

// group is what one ingest transaction executes: one request (a batch, a
// single event), or single events of one tenant coalesced (group.go), each
// under its own key with its own stored answer.
type group struct {
	tenantID uuid.UUID
	members  []*groupMember
	events   []*Event // every member's events, in member order
}

func newGroup(tenantID uuid.UUID, members []*groupMember) *group {
	g := &group{tenantID: tenantID, members: members}
	for _, m := range members {
		m.first = len(g.events)
		g.events = append(g.events, m.events...)
	}
	return g
}

// answer is one member's answer: a stored or new outcome, or its refusal
// (key reused with another body, key in progress).
type answer struct {
	out *Outcome
	err error
}

// result is the usage log of one event of a request: new, or the log an
// earlier request recorded with its request_id.
type result struct {
	log       *overage.UsageLog
	duplicate bool
}

// renderer turns the results of a request, in request order, into the
// answer that is stored and sent.
type renderer func(results []result) (*Outcome, error)

// execute records one request in its own transaction.
func (s *Service) execute(ctx context.Context, tenantID uuid.UUID, m *groupMember) (*Outcome, error) {
	answers, err := s.executeGroup(ctx, newGroup(tenantID, []*groupMember{m}))
	if err != nil {
		return nil, err
	}
	return answers[0].out, answers[0].err
}

// executeGroup records a group in one transaction, retried whole. A
// request_id digest collision (digest.go) refuses the request it is in:
// when the group holds several, each then runs alone, so that only the
// colliding one is refused.
func (s *Service) executeGroup(ctx context.Context, g *group) ([]answer, error) {
	answers, err := withRetries(func() ([]answer, error) {
		a, err := s.executeOnce(ctx, g)
		if err != nil {
			err = s.digestCollision(ctx, g, err)
		}
		return a, err
	})
	var appErr *overage.Error
	if !errors.As(err, &appErr) || appErr.Type != RequestIDDigestCollisionType || len(g.members) == 1 {
		return answers, err
	}
	answers = make([]answer, len(g.members))
	for i, m := range g.members {
		a, err := s.executeGroup(ctx, newGroup(g.tenantID, []*groupMember{m}))
		if err != nil {
			answers[i] = answer{err: err}
			continue
		}
		answers[i] = a[0]
	}
	return answers, nil
}

// withRetries runs one ingest transaction up to three times. A retryable
// error means it rolled back whole: a unique violation (a concurrent
// transaction committed the same key or request_id first: the next pass
// reads the winner's row and answers from it), a deadlock, or allowance
// given back under an unordered event (errAllowanceGivenBack).
func withRetries[T any](attempt func() (T, error)) (T, error) {
	const attempts = 3
	var err error
	for range attempts {
		var out T
		out, err = attempt()
		if err == nil {
			return out, nil
		}
		if !isRetryable(err) {
			break
		}
	}
	var zero T
	return zero, dbError(err)
}

// executeOnce is one ingest transaction (txn.go), in three round trips
// (four while an allowance is not yet used up): BEGIN, the claim and the
// reads (stored records, earlier logs of the request_ids, allowance and
// period totals) in one pipeline; only while some allowance is left, the
// period lock and a re-read of its total; the report jobs (River, one
// statement); the writes (totals, usage logs, stored responses) and COMMIT
// in one pipeline. Each member is answered as if it ran alone: a replay, a
// 409, or its events recorded (or found recorded) in arrival order through
// the same running totals, with its answer stored under its key in this
// transaction.
func (s *Service) executeOnce(ctx context.Context, g *group) ([]answer, error) {
	// The keys stay "in progress" exactly as long as this transaction: bound
	// it here, and in the server too should this process stall.
	ctx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	// Read (once a process, and after a change) before a connection is
	// held, so a full pool never waits on itself.
	cat, err := s.meters.Catalog(ctx, s.pool)
	if err != nil {
		return nil, fmt.Errorf("read meter catalog: %w", err)
	}
	insert, err := s.insertSQL(ctx)
	if err != nil {
		return nil, err
	}
	tx, slot, end, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	st, err := readState(ctx, tx, g, slot, cat, s.closeGrace())
	if err != nil {
		return nil, err
	}
	if err := s.catchUpCatalog(ctx, tx, st, cat); err != nil {
		return nil, err
	}
	if err := s.readRecorded(ctx, tx, st.claim, st.catalog, st.earlier); err != nil {
		return nil, err
	}
	answers, active := st.answerMembers(g)
	if len(active) == 0 {
		return answers, nil
	}
	results, fresh, dupOf := st.planEvents(g, active)
	w := &writes{}
	if len(fresh) > 0 {
		if err := st.order(ctx, tx, g, fresh); err != nil {
			return nil, err
		}
		if w, err = st.newLogs(g, fresh, results); err != nil {
			return nil, err
		}
		if err := s.queueJobs(ctx, tx, g.tenantID, st, w); err != nil {
			return nil, err
		}
	}
	for i, j := range dupOf {
		results[i] = result{log: results[j].log, duplicate: true}
	}
	stored, err := renderMembers(g, active, results, answers)
	if err != nil {
		return nil, err
	}
	if s.beforeWrites != nil {
		if err := s.beforeWrites(ctx); err != nil {
			return nil, err
		}
	}
	if err := commit(ctx, tx, g.tenantID, st, st.claim, w, stored, insert); err != nil {
		return nil, err
	}
	return answers, nil
}

// catchUpCatalog makes st route with the catalog the transaction sees when
// it changed since cat was cached, read through tx (not another
// connection: a full pool would wait on itself).
func (s *Service) catchUpCatalog(ctx context.Context, tx *pipeTx, st *state, cat *overage.Catalog) error {
	if st.catalogVersion <= cat.Version {
		return nil
	}
	var err error
	st.catalog, err = s.meters.Current(ctx, tx, st.catalogVersion)
	return err
}

// answerMembers is step 2 for every member: the answers of those replayed
// or refused, and the indexes of the members this transaction records.
func (st *state) answerMembers(g *group) ([]answer, []int) {
	answers := make([]answer, len(g.members))
	var active []int
	for i, m := range g.members {
		var goes bool
		answers[i].out, answers[i].err, goes = st.claim.answer(i, m.key, m.fingerprint)
		if goes {
			active = append(active, i)
		}
	}
	return answers, active
}

// planEvents sorts the active members' events: those whose request_id
// the tenant recorded earlier (their results set, duplicates), those
// whose request_id an earlier member of this group carries (dupOf: a
// later member's event is its duplicate, as in a transaction of its own),
// and the fresh ones to record, in arrival order.
func (st *state) planEvents(g *group, active []int) (results []result, fresh []int, dupOf map[int]int) {
	results = make([]result, len(g.events))
	recordedHere := map[string]int{}
	dupOf = map[int]int{}
	for _, mi := range active {
		m := g.members[mi]
		for i := m.first; i < m.first+len(m.events); i++ {
			ev := g.events[i]
			if ev.RequestID != nil {
				if l, ok := st.earlier[*ev.RequestID]; ok {
					results[i] = result{log: l, duplicate: true}
					continue
				}
				if j, ok := recordedHere[*ev.RequestID]; ok {
					dupOf[i] = j
					continue
				}
				recordedHere[*ev.RequestID] = i
			}
			fresh = append(fresh, i)
		}
	}
	return results, fresh, dupOf
}

// renderMembers renders each active member's answer from its results and
// returns the answers to store.
func renderMembers(g *group, active []int, results []result, answers []answer) ([]storedAnswer, error) {
	stored := make([]storedAnswer, len(active))
	for k, mi := range active {
		m := g.members[mi]
		out, err := m.render(results[m.first : m.first+len(m.events)])
		if err != nil {
			return nil, err
		}
		answers[mi].out = out
		stored[k] = storedAnswer{key: m.key, fingerprint: m.fingerprint, out: out}
	}
	return stored, nil
}

// queueJobs is step 4: the report job of w's billable logs and the
// threshold events they cross. Before the writes, so the counter rows the
// usage log insert updates stay locked only for the last pipeline and the
// commit.
func (s *Service) queueJobs(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, st *state, w *writes) error {
	if err := s.outbox.InsertReportsTx(ctx, tx, tenantID, w.reportIDs); err != nil {
		return err
	}
	return s.alerts.Record(ctx, tx, tenantID, w.meterUsage(st)...)
}

// nullID is id as an SQL argument, NULL for uuid.Nil.
func nullID(id uuid.UUID) pgtype.UUID {
	return pgtype.UUID{Bytes: id, Valid: id != uuid.Nil}
}

// pgUUID is id as an SQL argument pgx encodes directly: a uuid.UUID goes
// through driver.Valuer, its text, a failed encode and a re-parse (2.3 us
// an id against 0.07 us, go test -bench in pgx's pgtype.Map.Encode).
func pgUUID(id uuid.UUID) pgtype.UUID {
	return pgtype.UUID{Bytes: id, Valid: true}
}

// renderSingle answers one event: 202 with a new log, or 200 with the log
// recorded earlier under its request_id ("duplicate": true; nothing new is
// billed). Both are deterministic, so both are stored under the key.
func renderSingle(results []result) (*Outcome, error) {
	r := results[0]
	resp := fastjson.LogAnswer{UsageLog: r.log, Duplicate: r.duplicate}
	body, ok := fastjson.RenderLog(&resp)
	if !ok {
		var err error
		if body, err = json.Marshal(resp); err != nil {
			return nil, fmt.Errorf("render usage log: %w", err)
		}
	}
	if r.duplicate {
		return &Outcome{Status: http.StatusOK, Body: body, Kind: OutcomeDuplicate, UsageLogID: r.log.ID}, nil
	}
	out := &Outcome{Status: http.StatusAccepted, Body: body, Kind: OutcomeNew, UsageLogID: r.log.ID, stored: []byte{}}
	if r.log.StripeTimestamp == usagelog.TimestampReported {
		// Stored whole: a compact record replays as recorded, "usage".
		out.stored = nil
	}
	return out, nil
}

// renderBatch answers a batch: 202 with every event's log in request order.
func renderBatch(results []result) (*Outcome, error) {
	resp := fastjson.BatchAnswer{Events: make([]fastjson.BatchEvent, len(results))}
	for i, r := range results {
		resp.Events[i] = fastjson.BatchEvent{Index: i, Duplicate: r.duplicate, UsageLog: r.log}
		if r.duplicate {
			resp.Duplicates++
		} else {
			resp.Created++
		}
	}
	buf := takeAnswerBuf(fastjson.BatchSize(resp.Events))
	body, ok := fastjson.AppendBatch(buf, &resp)
	pooled := ok
	if !ok {
		var err error
		if body, err = json.Marshal(resp); err != nil {
			return nil, fmt.Errorf("render batch: %w", err)
		}
	}
	out := &Outcome{Status: http.StatusAccepted, Body: body, Kind: OutcomeNew, pooled: pooled}
	if resp.Duplicates == 0 && !anyReported(results) {
		out.stored = make([]byte, 1, 1+16*len(results))
		out.stored[0] = batchIDsMark
		for _, r := range results {
			out.stored = append(out.stored, r.log.ID[:]...)
		}
	}
	return out, nil
}

// anyReported: an answer shows a log of a closed period ("reported"), so it
// is stored whole, not compact (a compact record replays "usage").
func anyReported(results []result) bool {
	for _, r := range results {
		if r.log.StripeTimestamp == usagelog.TimestampReported {
			return true
		}
	}
	return false
}

// lockKey maps (tenant, key) to the 64-bit advisory lock id. A collision
// between two keys (odds 2^-64) would only make one answer 409 in
// progress; the primary key still decides what is recorded.
func lockKey(tenant uuid.UUID, key string) int64 {
	h := sha256.New()
	h.Write(tenant[:])
	h.Write([]byte(key))
	return int64(binary.BigEndian.Uint64(h.Sum(nil)))
}

// periodLockKey maps (tenant, allowance period) to the two 32-bit keys of
// its advisory lock: a key space apart from lockKey's 64-bit one. A
// collision only orders two periods' events needlessly.
func periodLockKey(tenant uuid.UUID, period time.Time) (int32, int32) {
	h := sha256.New()
	h.Write([]byte("allowance"))
	h.Write(tenant[:])
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(period.UnixMicro()))
	h.Write(b[:])
	sum := h.Sum(nil)
	return int32(binary.BigEndian.Uint32(sum[0:4])), int32(binary.BigEndian.Uint32(sum[4:8]))
}

type storedResponse struct {
	fingerprint []byte
	status      int
	body        []byte
	usageLogID  *uuid.UUID
	expiresAt   time.Time
	expired     bool
}

// expiredKey is a stored record found expired, to be replaced.
type expiredKey struct {
	key       string
	expiresAt time.Time
}

// An answer is mostly its logs' JSON (about 600 bytes a log), and the logs
// hold everything it said. So the answer of a request that recorded only
// new logs is stored as their ids and rendered again on replay, as the
// logs were when recorded (asRecorded), byte for byte. An answer that
// shows an earlier log (a duplicate request_id) shows it as it was then,
// and is stored whole.
//
// The compact forms: a single event's, an empty body with the log in
// usage_log_id; a batch's, a NUL byte (no JSON starts with one) and the
// 16-byte ids of its logs in request order.
const batchIDsMark = 0x00

// compactLogs returns the log ids of a compact record, in answer order,
// and whether it is one; ok with no ids is a malformed record.
func (r storedResponse) compactLogs() (ids []uuid.UUID, batch, ok bool) {
	switch {
	case len(r.body) == 0 && r.usageLogID != nil && r.status == http.StatusAccepted:
		return []uuid.UUID{*r.usageLogID}, false, true
	case len(r.body) > 0 && r.body[0] == batchIDsMark && (len(r.body)-1)%16 == 0:
		ids = make([]uuid.UUID, (len(r.body)-1)/16)
		for i := range ids {
			copy(ids[i][:], r.body[1+16*i:])
		}
		return ids, true, true
	}
	return nil, false, false
}

// replay answers a request under the record's key: its stored answer,
// byte for byte, or 409 for another body. recorded holds the logs of the
// compact records (readRecordedLogs).
func (r storedResponse) replay(fp []byte, recorded map[uuid.UUID]*overage.UsageLog) (*Outcome, error) {
	if string(r.fingerprint) != string(fp) {
		return nil, overage.Errorf(overage.ECONFLICT, "idempotency-key-reused",
			"this Idempotency-Key was already used with a different request body; use a new key for a new event")
	}
	if ids, batch, ok := r.compactLogs(); ok {
		results := make([]result, len(ids))
		for i, id := range ids {
			l, found := recorded[id]
			if !found {
				return nil, fmt.Errorf("replay: usage log %s of a stored answer is missing", id)
			}
			results[i] = result{log: asRecorded(l)}
		}
		render := renderSingle
		if batch {
			render = renderBatch
		}
		out, err := render(results)
		if err != nil {
			return nil, err
		}
		out.Kind, out.stored = OutcomeReplay, nil
		return out, nil
	}
	out := &Outcome{Status: r.status, Body: r.body, Kind: OutcomeReplay}
	if r.usageLogID != nil {
		out.UsageLogID = *r.usageLogID
	}
	return out, nil
}

// Get returns a usage log the caller may see: the owning tenant's, or any
// for an administrator (tenantID nil).
func (s *Service) Get(ctx context.Context, id uuid.UUID, tenantID *uuid.UUID) (*overage.UsageLog, error) {
	var l *overage.UsageLog
	err := s.readTx(ctx, func(tx pgx.Tx) (err error) {
		if l, err = scanLog(tx.QueryRow(ctx, getLogSQL, id)); err != nil {
			return err
		}
		if tenantID != nil && l.TenantID != *tenantID {
			return pgx.ErrNoRows
		}
		if err := s.present(ctx, tx, l); err != nil {
			return err
		}
		if err := s.stripeTimestampNow(ctx, tx, l); err != nil {
			return err
		}
		return s.withCorrections(ctx, tx, l)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		// Another tenant's log is reported as missing, not forbidden, so ids
		// cannot be probed.
		return nil, overage.NotFound("usage log %s not found", id)
	}
	if err != nil {
		return nil, dbError(fmt.Errorf("get usage log: %w", err))
	}
	return l, nil
}

// readSettingsSQL opens the read-only transactions of GET requests: each
// statement is planned for its arguments and the tables as they are (a
// custom plan), never by a generic plan cached while the tables were
// small, which reads usage_logs from end to end for one id (docs/plans.md).
const readSettingsSQL = `SELECT set_config('plan_cache_mode', 'force_custom_plan', true)`

// readTx runs f in a read-only transaction opened by readSettingsSQL.
func (s *Service) readTx(ctx context.Context, f func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, readSettingsSQL); err != nil {
			return err
		}
		return f(tx)
	})
}

// stripeTimestampNow corrects the StripeTimestamp of a log recorded while
// its period was open whose reports are not formed yet (stripe_timestamp
// NULL, read as "usage"): "reported" when its period is closed now.
func (s *Service) stripeTimestampNow(ctx context.Context, q overage.DB, l *overage.UsageLog) error {
	if l.StripeTimestamp != usagelog.TimestampUsage {
		return nil
	}
	var closed bool
	if err := q.QueryRow(ctx, closedSinceSQL, l.ID, s.closeGrace().Seconds()).Scan(&closed); err != nil {
		return fmt.Errorf("read whether the period of %s is closed: %w", l.ID, err)
	}
	if closed {
		l.StripeTimestamp = usagelog.TimestampReported
	}
	return nil
}

func isRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23505", "40001", "40P01": // unique violation, serialization failure, deadlock
			return true
		}
	}
	return errors.Is(err, errAllowanceGivenBack)
}

// dbError marks an unreachable database as EUNAVAILABLE (503).
func dbError(err error) error {
	return dberr.Classify(err, "the usage database is unreachable; nothing was recorded, retry with the same Idempotency-Key")
}

// asRecorded is l as it was when recorded, before any report touched it:
// its initial status, nothing sent or billed yet.
func asRecorded(l *overage.UsageLog) *overage.UsageLog {
	then := *l
	then.BillingStatus = overage.BillingStatusNotBillable
	if billable(then.Meters) {
		then.BillingStatus = overage.BillingStatusPending
	}
	then.BilledAt, then.FirstAttemptAt, then.BillingMessage = nil, nil, nil
	then.Meters, then.StripeEvents = asRecordedLines(then.Meters)
	then.CorrectedTotals, then.Corrections = nil, nil
	// Compact records are kept only of answers that said "usage".
	then.StripeTimestamp = usagelog.TimestampUsage
	return &then
}
