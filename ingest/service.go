package ingest

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
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
// advertised in the README and api/openapi.yaml.
const KeyTTL = idempotency.TTL

// lockTimeout bounds how long one ingest transaction — and so the claim on
// its Idempotency-Key — may live.
const lockTimeout = 10 * time.Second

// beginSQL sets the transaction's settings (txSettingsSQL), names its slot
// for the counter triggers (see slots.go), and tries each member's key
// lock, in the members' order: one statement. For single events (one, or a
// group) it also makes the transaction's prepared statements use their
// generic plan: they take arrays, for which PostgreSQL would otherwise plan
// every execution anew (docs/ingest.md has the measurements). A batch keeps
// plans made for its arrays.
var beginSQL = `SELECT ` + txSettingsSQL + `,
	set_config('plan_cache_mode', $3::text, true),
	set_config('overage.slot', $1::int::text, true),
	(SELECT array_agg(pg_try_advisory_xact_lock(l.k) ORDER BY l.o) FROM unnest($2::bigint[]) WITH ORDINALITY AS l (k, o))`

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
	// Kind says whether the answer is new, a duplicate or a replay, for
	// logs and metrics.
	Kind OutcomeKind
	// UsageLogID is the usage log the answer is about.
	UsageLogID uuid.UUID
	// stored, when not nil, is what is stored under the key instead of
	// Body: the answer's compact form (see storedResponse.compact).
	stored []byte
}

// OutcomeKind is what an Outcome answers: a new log, a duplicate of a
// request_id recorded before, or the stored answer replayed under its key.
type OutcomeKind string

const (
	OutcomeNew       OutcomeKind = "new"
	OutcomeDuplicate OutcomeKind = "duplicate"
	OutcomeReplay    OutcomeKind = "replay"
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

// executeGroup records a group in one transaction, retried whole.
func (s *Service) executeGroup(ctx context.Context, g *group) ([]answer, error) {
	return withRetries(func() ([]answer, error) { return s.executeOnce(ctx, g) })
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

// executeOnce is one ingest transaction, in three round trips (four while
// an allowance is not yet used up): BEGIN and the reads (key locks, stored
// records, earlier logs of the request_ids, allowance and period totals) in
// one pipeline; only while some allowance is left, the period lock and a
// re-read of its total; the report jobs (River, one statement); the writes
// (totals, usage logs, stored responses) and COMMIT in one pipeline. Each
// member is answered as if it ran alone: a replay, a 409, or its events
// recorded (or found recorded) in arrival order through the same running
// totals, with its answer stored under its key in this transaction.
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
	// Given back after the commit or rollback below, when its rows are
	// unlocked (deferred calls run last in, first out).
	slot := s.slots.take()
	defer s.slots.give(slot)
	tx, err := beginPipeTx(ctx, s.pool)
	if err != nil {
		return nil, fmt.Errorf("begin ingest transaction: %w", err)
	}
	defer tx.release(context.WithoutCancel(ctx))

	st, err := readState(ctx, tx, g, slot, cat, s.closeGrace())
	if err != nil {
		return nil, err
	}
	if st.catalogVersion > cat.Version {
		// The catalog changed since it was cached: route with the one this
		// transaction sees, read through it (not another connection: a
		// full pool would wait on itself).
		if st.catalog, err = s.meters.Current(ctx, tx, st.catalogVersion); err != nil {
			return nil, err
		}
	}
	recorded, err := readRecordedLogs(ctx, tx, st.recs)
	if err != nil {
		return nil, err
	}
	if err := s.presentAll(ctx, tx, st.catalog, recorded, st.earlier); err != nil {
		return nil, err
	}
	answers := make([]answer, len(g.members))
	var active []int // the members this transaction records
	for i, m := range g.members {
		rec, found := st.recs[m.key]
		switch {
		case found && !rec.expired:
			answers[i].out, answers[i].err = rec.replay(m.fingerprint, recorded)
		case !st.locked[i]:
			answers[i].err = errInProgress()
		default:
			if found { // expired: the key starts a new request
				st.expired = append(st.expired, expiredKey{m.key, rec.expiresAt})
			}
			active = append(active, i)
		}
	}
	if len(active) == 0 {
		return answers, nil
	}

	results := make([]result, len(g.events))
	var fresh []int // indexes of the events to record
	// A request_id recorded by an earlier member of this group: a later
	// member's event is its duplicate, as in a transaction of its own.
	recordedHere := map[string]int{}
	dupOf := map[int]int{}
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
	w := &writes{}
	if len(fresh) > 0 {
		if err := st.order(ctx, tx, g, fresh); err != nil {
			return nil, err
		}
		if w, err = st.newLogs(g, fresh, results); err != nil {
			return nil, err
		}
		// Before the writes, so the counter rows the usage log insert
		// updates stay locked only for the last pipeline and the commit.
		if err := s.outbox.InsertReportsTx(ctx, tx, g.tenantID, w.reportIDs); err != nil {
			return nil, err
		}
		if err := s.alerts.Record(ctx, tx, g.tenantID, w.meterUsage(st)...); err != nil {
			return nil, err
		}
	}
	for i, j := range dupOf {
		results[i] = result{log: results[j].log, duplicate: true}
	}
	for _, mi := range active {
		m := g.members[mi]
		out, err := m.render(results[m.first : m.first+len(m.events)])
		if err != nil {
			return nil, err
		}
		answers[mi].out = out
	}
	if s.beforeWrites != nil {
		if err := s.beforeWrites(ctx); err != nil {
			return nil, err
		}
	}
	if err := w.exec(ctx, tx, g, st, active, answers); err != nil {
		return nil, err
	}
	return answers, nil
}

// state is what an ingest transaction read before deciding.
type state struct {
	locked  []bool                       // per member: its key's lock was taken
	recs    map[string]storedResponse    // the members' stored records, by key
	expired []expiredKey                 // expired records to replace
	earlier map[string]*overage.UsageLog // by request_id
	// The tenant's allowance, the transaction's now() (created_at of its
	// logs), each event's allowance period, and each period's total.
	allowance overage.Overage
	now       time.Time
	periods   []time.Time
	totals    map[time.Time]*overage.Overage
	// ordered holds the periods whose allowance was not used up: this
	// transaction holds their lock and writes their slot 0.
	ordered map[time.Time]bool
	// slot is the transaction's leased slot for every other row it adds to.
	slot int16
	// The meters other than the defaults: their allowances, and their
	// period totals when the catalog had such meters (extraRead).
	included  map[string]int64
	extra     extraTotals
	extraRead bool
	// catalog is the meter catalog of the version the transaction read.
	catalog        *overage.Catalog
	catalogVersion int64
	routes         map[string]overage.Routing
	lineBlock      []overage.MeterLine // see newLines
	// closed holds the periods closed when the transaction read them
	// (usagelog.PeriodClosedSQL): their new logs answer "reported".
	closed map[time.Time]bool
}

// closedStartSQL: the period d.start of the tenant $1 is closed, $3 being
// PERIOD_CLOSE_GRACE in seconds (usagelog.PeriodClosedSQL).
var closedStartSQL = usagelog.PeriodClosedSQL("$1", "d.start", "$3")

var periodsSQL = `
	WITH ev AS (
		SELECT e.ts, e.ord FROM unnest($2::timestamptz[]) WITH ORDINALITY AS e (ts, ord)
	), p AS (
		SELECT ev.ord, coalesce((
			SELECT s.current_period_start FROM tenant_subscriptions s
			WHERE s.tenant_id = $1 AND s.current_period_start <= ev.ts AND ev.ts < s.current_period_end
			ORDER BY s.current_period_start DESC LIMIT 1), date_trunc('month', ev.ts, 'UTC')) AS start
		FROM ev
	), tot AS (
		SELECT d.start, coalesce(sum(a.input_tokens), 0)::bigint AS i, coalesce(sum(a.output_tokens), 0)::bigint AS o,
			` + closedStartSQL + ` AS closed
		FROM (SELECT DISTINCT start FROM p) d
		LEFT JOIN allowance_usage a ON a.tenant_id = $1 AND a.period_start = d.start
		GROUP BY d.start
	)
	SELECT p.start, tot.i, tot.o, t.included_input_tokens, t.included_output_tokens, now(),
		CASE WHEN p.ord = 1 THEN t.included_meters END, CASE WHEN p.ord = 1 THEN (SELECT version FROM meter_catalog) END,
		tot.closed
	FROM p JOIN tot ON tot.start = p.start CROSS JOIN tenants t
	WHERE t.id = $1
	ORDER BY p.ord`

// readState takes the members' key locks and reads, in one round trip and
// in snapshots taken after the locks: the stored records, the logs already
// recorded under the request_ids, the allowance and the period totals.
// The period of a usage timestamp is the tenant's Stripe subscription
// period covering it when the webhooks told us one (tenant_subscriptions),
// else its calendar month in UTC.
func readState(ctx context.Context, tx *pipeTx, g *group, slot int16, cat *overage.Catalog, grace time.Duration) (*state, error) {
	st := &state{slot: slot, recs: map[string]storedResponse{}, earlier: map[string]*overage.UsageLog{},
		totals: map[time.Time]*overage.Overage{}, ordered: map[time.Time]bool{}, extra: extraTotals{}, catalog: cat,
		closed: map[time.Time]bool{}}
	var rids pgArray[pgString]
	ts := make(pgArray[pgTimestamptz], len(g.events))
	for i, ev := range g.events {
		if ev.RequestID != nil {
			rids = append(rids, pgString(*ev.RequestID))
		}
		ts[i] = pgTimestamptz(ev.Timestamp)
	}
	keys, locks := make([]string, len(g.members)), make([]int64, len(g.members))
	for i, m := range g.members {
		keys[i], locks[i] = m.key, lockKey(g.tenantID, m.key)
	}
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	planMode := "auto"
	if len(g.events) == 1 || len(g.members) > 1 {
		// A group of single events (about 12 at 32 clients) too: PostgreSQL's
		// CPU an event 119 and 152 µs with generic plans, 124 and 158 µs with
		// custom ones (A B B A; one tenant, 32 clients of bench/ingestload,
		// CPU of the backends read from /proc over 8 s).
		planMode = "force_generic_plan"
	}
	b.Queue(beginSQL, slot, locks, planMode)
	b.Queue(idempotency.LookupSQL, pgUUID(g.tenantID), keys)
	if len(rids) > 0 {
		b.Queue(logsByRequestIDSQL, pgUUID(g.tenantID), rids)
	}
	b.Queue(periodsSQL, pgUUID(g.tenantID), ts, grace.Seconds())
	if cat.Extra() {
		b.Queue(extraTotalsSQL, pgUUID(g.tenantID), ts)
		st.extraRead = true
	}
	br := tx.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("begin ingest transaction: %w", err)
	}
	settings := make([]any, txSettingsColumns+2, txSettingsColumns+3)
	if err := br.QueryRow().Scan(append(settings, &st.locked)...); err != nil {
		return nil, fmt.Errorf("take idempotency locks: %w", err)
	}
	if len(st.locked) != len(g.members) {
		return nil, fmt.Errorf("take idempotency locks: %d answers for %d keys", len(st.locked), len(g.members))
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("read idempotency records: %w", err)
	}
	for rows.Next() {
		var key string
		var rec storedResponse
		if err := rows.Scan(&key, &rec.fingerprint, &rec.status, &rec.body, &rec.usageLogID, &rec.expiresAt, &rec.expired); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read idempotency records: %w", err)
		}
		st.recs[key] = rec
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read idempotency records: %w", err)
	}
	if len(rids) > 0 {
		rows, err := br.Query()
		if err != nil {
			return nil, fmt.Errorf("read usage logs by request_id: %w", err)
		}
		for rows.Next() {
			l, err := scanLog(rows)
			if err != nil {
				rows.Close()
				return nil, fmt.Errorf("read usage logs by request_id: %w", err)
			}
			st.earlier[*l.RequestID] = l
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("read usage logs by request_id: %w", err)
		}
	}
	rows, err = br.Query()
	if err != nil {
		return nil, fmt.Errorf("read allowance periods: %w", err)
	}
	// One row an event, but as many totals as periods: scanned into the
	// same variables, copied once a period.
	var start time.Time
	var tot overage.Overage
	var version *int64
	var included map[string]int64
	var closed bool
	st.periods = make([]time.Time, 0, len(g.events))
	for rows.Next() {
		if err := rows.Scan(&start, &tot.InputTokens, &tot.OutputTokens,
			&st.allowance.InputTokens, &st.allowance.OutputTokens, &st.now, &included, &version, &closed); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read allowance periods: %w", err)
		}
		start, st.now = start.UTC(), st.now.UTC()
		if version != nil {
			st.catalogVersion, st.included, version = *version, included, nil
		}
		st.periods = append(st.periods, start)
		if closed {
			st.closed[start] = true
		}
		if _, ok := st.totals[start]; !ok {
			t := tot
			st.totals[start] = &t
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read allowance periods: %w", err)
	}
	if len(st.periods) != len(g.events) {
		return nil, fmt.Errorf("read allowance periods: %d periods for %d events", len(st.periods), len(g.events))
	}
	if st.extraRead {
		if err := st.scanExtraTotals(br.Query()); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// scanExtraTotals reads the rows of extraTotalsSQL (or the re-read after
// the period lock) into st.extra, replacing the periods it names.
func (st *state) scanExtraTotals(rows pgx.Rows, err error) error {
	if err != nil {
		return fmt.Errorf("read meter totals: %w", err)
	}
	defer rows.Close()
	var start time.Time
	var meter string
	var n int64
	for rows.Next() {
		if err := rows.Scan(&start, &meter, &n); err != nil {
			return fmt.Errorf("read meter totals: %w", err)
		}
		st.extra.add(start.UTC(), meter, n)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read meter totals: %w", err)
	}
	return nil
}

// order makes the totals exact where the split needs them. A period whose
// committed total had reached the allowance in both dimensions needs
// nothing: totals only grow, so each new event's overage is all its
// tokens whatever the order. Any other period of the new events is locked
// (sorted, so two batches never wait for each other in a cycle) and its
// total read again in a statement that starts after the lock is granted:
// every event that charged it before committed, and one that did not take
// the lock only ran because the total it saw — which this read sees too —
// was already at the allowance.
func (st *state) order(ctx context.Context, tx pgx.Tx, g *group, fresh []int) error {
	// The meters the new events feed, per period: the allowances of those
	// count, the others' do not.
	fed := st.fedMeters(g, fresh)
	var open []time.Time
	for _, i := range fresh {
		p := st.periods[i]
		if st.ordered[p] || !st.needsOrder(p, fed[p], fed == nil) {
			continue
		}
		st.ordered[p] = true
		open = append(open, p)
	}
	if len(open) == 0 {
		return nil
	}
	type lock struct{ a, b int32 }
	locks := make([]lock, len(open))
	for i, p := range open {
		a, b := periodLockKey(g.tenantID, p)
		locks[i] = lock{a, b}
	}
	slices.SortFunc(locks, func(x, y lock) int {
		if c := cmp.Compare(x.a, y.a); c != 0 {
			return c
		}
		return cmp.Compare(x.b, y.b)
	})
	b := &pgx.Batch{}
	for _, l := range locks {
		b.Queue(`SELECT pg_advisory_xact_lock($1::int4, $2::int4)`, l.a, l.b)
	}
	b.Queue(`SELECT period_start, sum(input_tokens)::bigint, sum(output_tokens)::bigint FROM allowance_usage
		WHERE tenant_id = $1 AND period_start = ANY($2) GROUP BY period_start`, pgUUID(g.tenantID), open)
	extras := st.catalog.Extra()
	if extras {
		b.Queue(`SELECT period_start, meter, sum(tokens)::bigint FROM meter_usage
			WHERE tenant_id = $1 AND period_start = ANY($2) GROUP BY 1, 2`, pgUUID(g.tenantID), open)
	}
	br := tx.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	for range locks {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("lock allowance period: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("read allowance totals: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var start time.Time
		var tot overage.Overage
		if err := rows.Scan(&start, &tot.InputTokens, &tot.OutputTokens); err != nil {
			return fmt.Errorf("read allowance totals: %w", err)
		}
		*st.totals[start.UTC()] = tot
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read allowance totals: %w", err)
	}
	rows.Close()
	if extras {
		for _, p := range open {
			delete(st.extra, p)
		}
		if err := st.scanExtraTotals(br.Query()); err != nil {
			return err
		}
	}
	return nil
}

// route is the routing of model's tokens, computed once per model.
func (st *state) route(model string) overage.Routing {
	if st.routes == nil {
		st.routes = map[string]overage.Routing{}
	}
	r, ok := st.routes[model]
	if !ok {
		r = st.catalog.Route(model)
		st.routes[model] = r
	}
	return r
}

// writes are the rows an ingest transaction adds.
type writes struct {
	logs      []*overage.UsageLog
	periods   []time.Time
	reportIDs []uuid.UUID
	// Token deltas of the default meters per period, in first-seen order,
	// and of the other meters per period and meter.
	deltaOrder []time.Time
	deltas     map[time.Time]*overage.Overage
	extra      []meterDelta
	// lines of the logs, in their order.
	lines [][]overage.MeterLine
}

// meterDelta is tokens added to one non-default meter's period total.
type meterDelta struct {
	period time.Time
	meter  string
	tokens int64
}

// newLogs computes, in arrival order, each new event's overage from its
// period's running total: the part of the event above the allowance,
// max(0, after - allowance) - max(0, before - allowance) per dimension,
// which splits an event that crosses the allowance exactly.
func (st *state) newLogs(g *group, fresh []int, results []result) (*writes, error) {
	w := &writes{deltas: map[time.Time]*overage.Overage{}}
	// The random bits of every id in one read of crypto/rand rather than
	// one each (half of this function's time), and one allocation for the
	// logs of a batch, not one each.
	random := make([]byte, 16*len(fresh))
	if _, err := rand.Read(random); err != nil {
		return nil, fmt.Errorf("usage log ids: %w", err)
	}
	randomIDs := bytes.NewReader(random)
	logs := make([]overage.UsageLog, len(fresh))
	w.logs = make([]*overage.UsageLog, 0, len(fresh))
	w.periods = make([]time.Time, 0, len(fresh))
	w.lines = make([][]overage.MeterLine, 0, len(fresh))
	extra := map[meterDelta]int{} // index in w.extra, by (period, meter)
	for k, i := range fresh {
		ev := g.events[i]
		p := st.periods[i]
		id, err := uuid.NewV7FromReader(randomIDs)
		if err != nil {
			return nil, fmt.Errorf("usage log id: %w", err)
		}
		lines, err := st.linesOf(ev.ModelID, overage.Amounts(ev.InputTokens, ev.OutputTokens, ev.Parts), p)
		if err != nil {
			return nil, err
		}
		l := &logs[k]
		*l = overage.UsageLog{
			ID: id, TenantID: g.tenantID, RequestID: ev.RequestID, Timestamp: ev.Timestamp,
			UserID: ev.UserID, ModelID: ev.ModelID, InputTokens: ev.InputTokens, OutputTokens: ev.OutputTokens,
			TokenParts:      ev.Parts,
			BillingStatus:   overage.BillingStatusNotBillable,
			CreatedAt:       st.now,
			Kind:            overage.KindUsage,
			StripeTimestamp: usagelog.TimestampUsage,
		}
		if st.closed[p] {
			l.StripeTimestamp = usagelog.TimestampReported
		}
		if billable(lines) {
			l.BillingStatus = overage.BillingStatusPending
			w.reportIDs = append(w.reportIDs, id)
		}
		l.Meters = rawLinesInto(st.newLines(len(lines)), l, lines)
		st.catalog.Present(l)
		results[i] = result{log: l}
		w.logs = append(w.logs, l)
		w.periods = append(w.periods, p)
		w.lines = append(w.lines, lines)
		d, ok := w.deltas[p]
		if !ok {
			d = &overage.Overage{}
			w.deltas[p] = d
			w.deltaOrder = append(w.deltaOrder, p)
		}
		d.InputTokens += lines[0].Tokens
		d.OutputTokens += lines[1].Tokens
		for _, ln := range lines[2:] {
			key := meterDelta{period: p, meter: ln.Meter}
			j, ok := extra[key]
			if !ok {
				j = len(w.extra)
				extra[key] = j
				w.extra = append(w.extra, key)
			}
			w.extra[j].tokens += ln.Tokens
		}
	}
	return w, nil
}

// meterUsage is how the new logs change each meter's period total (the
// running totals newLogs left in st). The totals are exact for every
// period with allowance left on a meter it feeds (st.order read them under
// the period's lock); a period past the allowance of every meter it feeds
// crosses no threshold (thresholds are at most 100%).
func (w *writes) meterUsage(st *state) []alerts.Usage {
	out := make([]alerts.Usage, 0, 2*len(w.deltaOrder)+len(w.extra))
	for _, p := range w.deltaOrder {
		after, d := st.totals[p], w.deltas[p]
		out = append(out,
			alerts.Usage{Meter: overage.MeterInput, PeriodStart: p, Included: st.allowance.InputTokens, Before: after.InputTokens - d.InputTokens, After: after.InputTokens},
			alerts.Usage{Meter: overage.MeterOutput, PeriodStart: p, Included: st.allowance.OutputTokens, Before: after.OutputTokens - d.OutputTokens, After: after.OutputTokens})
	}
	for _, d := range w.extra {
		after := st.extra[d.period][d.meter]
		out = append(out, alerts.Usage{Meter: d.meter, PeriodStart: d.period, Included: st.included[d.meter], Before: after - d.tokens, After: after})
	}
	return out
}

// exec writes and commits, in one round trip: the expired records'
// removal, the period totals (slot 0 of an ordered period, else the
// transaction's slot), the usage logs (in request_id order, so two batches
// sharing request_ids wait for each other instead of deadlocking), the
// active members' stored responses, COMMIT.
func (w *writes) exec(ctx context.Context, tx *pipeTx, g *group, st *state, active []int, answers []answer) error {
	b := &pgx.Batch{}
	for _, e := range st.expired {
		b.Queue(idempotency.DeleteExpiredSQL, pgUUID(g.tenantID), e.key, e.expiresAt)
	}
	if len(w.logs) > 0 {
		queueUsedUpGuard(b, g.tenantID, st, w.deltaOrder, w.deltas, w.extra)
		n := len(w.deltaOrder)
		starts, ordered := make([]time.Time, n), make([]bool, n)
		ins, outs := make([]int64, n), make([]int64, n)
		for i, p := range w.deltaOrder {
			starts[i], ordered[i] = p, st.ordered[p]
			ins[i], outs[i] = w.deltas[p].InputTokens, w.deltas[p].OutputTokens
		}
		b.Queue(`INSERT INTO allowance_usage AS a (tenant_id, period_start, slot, input_tokens, output_tokens)
			SELECT $1, d.start, CASE WHEN d.ordered THEN 0 ELSE $6::smallint END, d.i, d.o
			FROM unnest($2::timestamptz[], $3::bool[], $4::bigint[], $5::bigint[]) AS d (start, ordered, i, o)
			ORDER BY 2, 3
			ON CONFLICT (tenant_id, period_start, slot) DO UPDATE
			SET input_tokens = a.input_tokens + EXCLUDED.input_tokens,
			    output_tokens = a.output_tokens + EXCLUDED.output_tokens`,
			pgUUID(g.tenantID), starts, ordered, ins, outs, st.slot)
		if len(w.extra) > 0 {
			queueMeterTotals(b, g.tenantID, st, w.extra)
		}

		m := len(w.logs)
		ids, rids := make(pgArray[pgtype.UUID], m), make(pgArray[pgtype.Text], m)
		tss, periods := make(pgArray[pgTimestamptz], m), make(pgArray[pgTimestamptz], m)
		users, models, statuses := make(pgArray[pgString], m), make(pgArray[pgString], m), make(pgArray[pgString], m)
		in, out, oin, oout := make(pgArray[pgInt8], m), make(pgArray[pgInt8], m), make(pgArray[pgInt8], m), make(pgArray[pgInt8], m)
		// The parts are rare: NULL arrays (one argument each) unless some
		// event of the transaction reported one.
		var reads, writes, reasons []*int64
		var flat flatLines
		// A log of a period closed now is reported at send time, whenever
		// its report is formed (closed is for good): recorded as such.
		closed := make(pgArray[pgTimestamptz], 0, len(st.closed))
		for p := range st.closed {
			closed = append(closed, pgTimestamptz(p))
		}
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
		}
		b.Queue(`INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
				period_start, overage_input_tokens, overage_output_tokens, billing_status, created_at, updated_at,
				cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens,
				meter_keys, meter_tokens, meter_overage, stripe_timestamp)
			SELECT u.id, $1, u.rid, u.ts, u.usr, u.model, u.i, u.o, u.period, u.oi, u.oo, u.status, $13, $13, u.cr, u.cw, u.rs,
				string_to_array(u.mk, ','),
				CASE WHEN u.cnt > 0 THEN ($18::bigint[])[u.lo + 1 : u.lo + u.cnt] END,
				CASE WHEN u.cnt > 0 THEN ($19::bigint[])[u.lo + 1 : u.lo + u.cnt] END,
				CASE WHEN u.period = ANY($22::timestamptz[]) THEN 'reported' END
			FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::text[], $6::text[], $7::bigint[], $8::bigint[],
				$9::timestamptz[], $10::bigint[], $11::bigint[], $12::text[], $14::bigint[], $15::bigint[], $16::bigint[],
				$17::text[], $20::int[], $21::int[])
				AS u (id, rid, ts, usr, model, i, o, period, oi, oo, status, cr, cw, rs, mk, lo, cnt)
			ORDER BY u.rid COLLATE "C"`,
			pgUUID(g.tenantID), ids, rids, tss, users, models, in, out, periods, oin, oout, statuses, st.now, reads, writes, reasons,
			flat.keys, flat.tokens, flat.over, flat.offsets, flat.count, closed)
	}
	n := len(active)
	keys, fps, statuses, bodies, logIDs := make(pgArray[pgString], n), make([][]byte, n), make([]int32, n), make([][]byte, n), make(pgArray[pgtype.UUID], n)
	for i, mi := range active {
		m, out := g.members[mi], answers[mi].out
		keys[i], fps[i], statuses[i], bodies[i], logIDs[i] = pgString(m.key), m.fingerprint, int32(out.Status), out.Body, nullID(out.UsageLogID)
		if out.stored != nil {
			bodies[i] = out.stored
		}
	}
	b.Queue(idempotency.InsertSQL, pgUUID(g.tenantID), keys, fps, statuses, bodies, logIDs, KeyTTL.Seconds())
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

// errTotalOverflow answers events that would take their period's total
// past what a bigint holds: nothing is recorded.
var errTotalOverflow = overage.Invalid([]overage.FieldError{
	{Field: "input_tokens", Detail: "would take its billing period's total past 9223372036854775807 tokens"},
	{Field: "output_tokens", Detail: "would take its billing period's total past 9223372036854775807 tokens"},
}, "the tokens would overflow their billing period's total; nothing was recorded")

// errAllowanceGivenBack: a correction gave allowance back to a period this
// transaction charged without ordering (see queueUsedUpGuard). It rolled
// back whole; the next attempt reads the lower total and takes the ordered
// path.
var errAllowanceGivenBack = errors.New("a correction gave allowance back to the period meanwhile")

// queueUsedUpGuard keeps the unordered path exact against corrections. An
// unordered period was charged all its tokens because its committed total
// had reached the allowance, relying on totals only growing — which a
// correction (or a lowering final checkpoint) breaks: it lowers the total
// under the period's exclusive lock. So before writing, the transaction
// takes that lock shared (unordered transactions never wait for each
// other) and checks, in a statement that starts after the lock is granted,
// that the total is still at or above the allowance; if a correction
// committed in between, the check divides by zero and the transaction
// rolls back to be retried. A correction that comes later waits for this
// transaction's commit and then counts its tokens.
//
// A tenant without allowance needs none of this: no total is ever below
// zero.
//
// Only what the transaction charged counts: a default meter it gave no
// tokens in a period is not checked there (its total may stay below the
// allowance: needsOrder did not order for it), and a period where it
// charged no meter with an allowance takes no lock.
func queueUsedUpGuard(b *pgx.Batch, tenantID uuid.UUID, st *state, periods []time.Time, deltas map[time.Time]*overage.Overage, extra []meterDelta) {
	guarded := map[time.Time]bool{}
	// The other meters with an allowance this transaction charged in an
	// unordered period.
	var extraPeriods []time.Time
	var extraKeys []string
	var extraIncs []int64
	for _, d := range extra {
		if inc := st.included[d.meter]; inc > 0 && !st.ordered[d.period] {
			extraPeriods, extraKeys, extraIncs = append(extraPeriods, d.period), append(extraKeys, d.meter), append(extraIncs, inc)
			guarded[d.period] = true
		}
	}
	// The default meters': each unordered period's allowance of each
	// default meter charged there (0: not charged, nothing to check).
	var unordered []time.Time
	var minIn, minOut []int64
	for _, p := range periods {
		if st.ordered[p] {
			continue
		}
		var in, out int64
		if deltas[p].InputTokens > 0 {
			in = st.allowance.InputTokens
		}
		if deltas[p].OutputTokens > 0 {
			out = st.allowance.OutputTokens
		}
		if in > 0 || out > 0 {
			unordered, minIn, minOut = append(unordered, p), append(minIn, in), append(minOut, out)
			guarded[p] = true
		}
	}
	if len(guarded) == 0 {
		return
	}
	type lock struct{ a, b int32 }
	locks := make([]lock, 0, len(guarded))
	for p := range guarded {
		a, b := periodLockKey(tenantID, p)
		locks = append(locks, lock{a, b})
	}
	slices.SortFunc(locks, func(x, y lock) int {
		if c := cmp.Compare(x.a, y.a); c != 0 {
			return c
		}
		return cmp.Compare(x.b, y.b)
	})
	for _, l := range locks {
		b.Queue(`SELECT pg_advisory_xact_lock_shared($1::int4, $2::int4)`, l.a, l.b)
	}
	if len(unordered) > 0 {
		b.Queue(`SELECT 1 / CASE WHEN count(*) = 0 THEN 1 ELSE 0 END FROM (
				SELECT a.period_start FROM allowance_usage a
				JOIN unnest($2::timestamptz[], $3::bigint[], $4::bigint[]) AS d (start, i, o) ON a.period_start = d.start
				WHERE a.tenant_id = $1
				GROUP BY a.period_start, d.i, d.o HAVING sum(a.input_tokens) < d.i OR sum(a.output_tokens) < d.o) AS given_back`,
			pgUUID(tenantID), unordered, minIn, minOut)
	}
	if len(extraKeys) > 0 {
		// The same for every other meter with an allowance: charged whole
		// only because its total had reached it.
		b.Queue(`SELECT 1 / CASE WHEN count(*) = 0 THEN 1 ELSE 0 END
			FROM unnest($2::timestamptz[], $3::text[], $4::bigint[]) AS a (start, meter, included)
			WHERE (SELECT coalesce(sum(m.tokens), 0) FROM meter_usage m
				WHERE m.tenant_id = $1 AND m.period_start = a.start AND m.meter = a.meter) < a.included`,
			pgUUID(tenantID), extraPeriods, extraKeys, extraIncs)
	}
}

// queueMeterTotals adds the tokens of the meters other than the defaults
// to their period totals: an ordered period's slot 0, else the
// transaction's slot, in (period, meter, slot) order, after
// allowance_usage (every writer takes the two tables in that order).
func queueMeterTotals(b *pgx.Batch, tenantID uuid.UUID, st *state, deltas []meterDelta) {
	n := len(deltas)
	starts, meters, slots, tokens := make([]time.Time, n), make([]string, n), make([]int16, n), make([]int64, n)
	for i, d := range deltas {
		starts[i], meters[i], tokens[i] = d.period, d.meter, d.tokens
		if !st.ordered[d.period] {
			slots[i] = st.slot
		}
	}
	b.Queue(`INSERT INTO meter_usage AS a (tenant_id, period_start, meter, slot, tokens)
		SELECT $1, d.start, d.meter, d.slot, d.tokens
		FROM unnest($2::timestamptz[], $3::text[], $4::smallint[], $5::bigint[]) AS d (start, meter, slot, tokens)
		ORDER BY d.start, d.meter COLLATE "C", d.slot
		ON CONFLICT (tenant_id, period_start, meter, slot) DO UPDATE SET tokens = a.tokens + EXCLUDED.tokens`,
		pgUUID(tenantID), starts, meters, slots, tokens)
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
	body, ok := fastjson.RenderBatch(&resp)
	if !ok {
		var err error
		if body, err = json.Marshal(resp); err != nil {
			return nil, fmt.Errorf("render batch: %w", err)
		}
	}
	out := &Outcome{Status: http.StatusAccepted, Body: body, Kind: OutcomeNew}
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

// logsByRequestIDSQL reads the tenant's logs recorded under the
// request_ids in $2: one index probe a request_id, as idempotency.LookupSQL.
var logsByRequestIDSQL = `SELECT ` + logColumns + `
	FROM unnest($2::text[]) AS r (rid)
	CROSS JOIN LATERAL (
		SELECT * FROM usage_logs l WHERE l.tenant_id = $1 AND l.request_id = r.rid LIMIT 1) AS u`

const logColumns = `id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
	cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens,
	overage_input_tokens, overage_output_tokens, billing_status, billed_at, created_at,
	first_attempt_at, billing_message, input_accepted_at, output_accepted_at, input_report_lead, output_report_lead,
	corrects, correction_reason, meter_keys, meter_tokens, meter_overage, meter_leads, meter_accepted_at, corrected_by,
	coalesce(stripe_timestamp, 'usage')`

func scanLog(row pgx.Row) (*overage.UsageLog, error) {
	l := &overage.UsageLog{}
	var inAt, outAt *time.Time
	var inLead, outLead *uuid.UUID
	var keys []string
	var tokens, over []int64
	var leads []pgtype.UUID
	var accepted []pgtype.Timestamptz
	if err := row.Scan(&l.ID, &l.TenantID, &l.RequestID, &l.Timestamp, &l.UserID, &l.ModelID, &l.InputTokens, &l.OutputTokens,
		&l.CacheRead, &l.CacheWrite, &l.Reasoning,
		&l.Overage.InputTokens, &l.Overage.OutputTokens, &l.BillingStatus, &l.BilledAt, &l.CreatedAt,
		&l.FirstAttemptAt, &l.BillingMessage, &inAt, &outAt, &inLead, &outLead, &l.Corrects, &l.Reason,
		&keys, &tokens, &over, &leads, &accepted, &l.CorrectedBy, &l.StripeTimestamp); err != nil {
		return nil, err
	}
	lines, err := rowLines(l, inLead, outLead, inAt, outAt, keys, tokens, over, leads, accepted)
	if err != nil {
		return nil, err
	}
	l.Meters = lines
	l.Kind = overage.KindUsage
	if l.Corrects != nil {
		l.Kind = overage.KindCorrection
	}
	l.Timestamp = l.Timestamp.UTC()
	l.CreatedAt = l.CreatedAt.UTC()
	l.StripeEvents = meterEvents(l.Overage, [2]*uuid.UUID{inLead, outLead}, [2]*time.Time{inAt, outAt})
	return l, nil
}

// meterEvents names, per dimension with overage, the meter event that
// carries it: the report led by leads[i] (nil until the log joins one), and
// when Stripe accepted it.
func meterEvents(o overage.Overage, leads [2]*uuid.UUID, accepted [2]*time.Time) []overage.StripeEvent {
	n := 0
	for _, d := range overage.Dimensions {
		if o.Of(d) != 0 {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]overage.StripeEvent, 0, n)
	for i, d := range overage.Dimensions {
		if v := o.Of(d); v != 0 {
			e := overage.StripeEvent{Dimension: d, Value: v, AcceptedAt: accepted[i]}
			if leads[i] != nil {
				key := overage.MeterEventKey(*leads[i], d)
				e.Identifier = &key
			}
			out = append(out, e)
		}
	}
	return out
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

// getLogSQL reads the log $1.
const getLogSQL = `SELECT ` + logColumns + ` FROM usage_logs WHERE id = $1`

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
	if err := q.QueryRow(ctx, `SELECT u.stripe_timestamp IS NULL AND `+usagelog.PeriodClosedSQL("u.tenant_id", "u.period_start", "$2")+`
		FROM usage_logs u WHERE u.id = $1`, l.ID, s.closeGrace().Seconds()).Scan(&closed); err != nil {
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

// readRecordedLogs reads the logs of the live compact records among recs,
// by id (none: no query).
func readRecordedLogs(ctx context.Context, q overage.DB, recs map[string]storedResponse) (map[uuid.UUID]*overage.UsageLog, error) {
	var ids pgArray[pgtype.UUID]
	for _, r := range recs {
		if logs, _, ok := r.compactLogs(); ok && !r.expired {
			for _, id := range logs {
				ids = append(ids, pgUUID(id))
			}
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, `SELECT `+logColumns+` FROM usage_logs WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("read the usage logs of stored answers: %w", err)
	}
	defer rows.Close()
	out := make(map[uuid.UUID]*overage.UsageLog, len(ids))
	for rows.Next() {
		l, err := scanLog(rows)
		if err != nil {
			return nil, fmt.Errorf("read the usage logs of stored answers: %w", err)
		}
		out[l.ID] = l
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the usage logs of stored answers: %w", err)
	}
	return out, nil
}
