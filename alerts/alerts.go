// Package alerts tells a tenant when its usage crosses a threshold of a
// meter's allowance: the event is recorded, with its delivery job, in the
// ingest transaction that takes the meter's period total across the
// threshold (the outbox), once per tenant × meter × period × threshold by a
// unique constraint; River workers POST it, signed, to the tenant's
// endpoint until it answers 2xx or three days pass. The package also
// answers GET /v1/usage (the period so far, from counters) and
// GET /v1/events (the tenant's events and their delivery status).
//
// A meter is named by its key; today's two allowance dimensions are the
// meters "input" and "output".
package alerts

import (
	"context"
	"encoding/hex"
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/overage-billing/overage/tenants"
)

// Meter keys of the two default meters.
const (
	MeterInput  = "input"
	MeterOutput = "output"
)

// EventType is the type of every threshold event.
const EventType = "usage.threshold_crossed"

// QueueAlerts is the River queue of deliveries: their own, with bounded
// workers, so an endpoint that hangs delays neither billing nor the
// maintenance jobs.
const QueueAlerts = "alerts"

// MaxThresholds bounds how many thresholds a tenant may set.
const MaxThresholds = 10

// DefaultCacheTTL is how long a Recorder trusts the thresholds it read of
// a tenant: a change of thresholds applies to usage ingested at most this
// long after it (at once in the process that made it, see Forget).
const DefaultCacheTTL = 5 * time.Second

// Usage is how one ingest transaction changed one meter's period total:
// Before and After are the period's total before and after the
// transaction, exactly (ingest computes them under the period's lock
// whenever some allowance was left); Included is the meter's allowance.
type Usage struct {
	Meter       string
	PeriodStart time.Time
	Included    int64
	Before      int64
	After       int64
}

// Recorder records threshold events in ingest transactions. A nil
// *Recorder records nothing.
type Recorder struct {
	river *river.Client[pgx.Tx]
	ttl   time.Duration
	now   func() time.Time

	mu    sync.Mutex
	cache map[uuid.UUID]tenantAlerts
}

type tenantAlerts struct {
	thresholds []int16
	hasURL     bool
	loaded     time.Time
}

// NewRecorder returns a Recorder that queues deliveries with rc (an
// insert-only client will do).
func NewRecorder(rc *river.Client[pgx.Tx]) *Recorder {
	return &Recorder{river: rc, ttl: DefaultCacheTTL, now: time.Now, cache: map[uuid.UUID]tenantAlerts{}}
}

// WithCacheTTL sets how long the thresholds read of a tenant are used
// (0: read them on every crossing candidate).
func (r *Recorder) WithCacheTTL(d time.Duration) *Recorder {
	r.ttl = d
	return r
}

// Forget drops what r knows of a tenant's thresholds, so the next crossing
// candidate reads them again.
func (r *Recorder) Forget(tenantID uuid.UUID) {
	if r == nil {
		return
	}
	r.mu.Lock()
	delete(r.cache, tenantID)
	r.mu.Unlock()
}

// Level is the total at which pct percent of included is reached:
// ceil(included × pct / 100), without overflow.
func Level(included int64, pct int) int64 {
	hi, lo := bits.Mul64(uint64(included), uint64(pct))
	q, rem := bits.Div64(hi, lo, 100)
	if rem != 0 {
		q++
	}
	return int64(q)
}

// crossed reports whether u took its total across pct percent.
func crossed(u Usage, pct int16) bool {
	if u.Included <= 0 || u.After <= u.Before {
		return false
	}
	l := Level(u.Included, int(pct))
	return u.Before < l && l <= u.After
}

// candidate reports whether u could cross any threshold: its total grew
// and was below the allowance (every threshold is at most 100%).
func candidate(u Usage) bool {
	return u.Included > 0 && u.After > u.Before && u.Before < u.Included
}

// Record records, in the ingest transaction tx, an event for every
// threshold of the tenant that usage crossed, and its delivery job. An
// event already recorded for the tenant, meter, period and threshold (a
// correction went back below it and usage crossed again, or a concurrent
// transaction crossed it first) is not recorded again: the unique
// constraint decides. When nothing can have crossed a threshold — the
// common case: the total did not grow, or was past the allowance, or the
// tenant has none — it touches no database, so ingest pays nothing for
// alerts.
func (r *Recorder) Record(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, usage ...Usage) error {
	if r == nil {
		return nil
	}
	maybe := false
	for _, u := range usage {
		if candidate(u) {
			maybe = true
			break
		}
	}
	if !maybe {
		return nil
	}
	ta, err := r.thresholds(ctx, tx, tenantID)
	if err != nil {
		return err
	}
	var ids []uuid.UUID
	var meters []string
	var periods []time.Time
	var pcts []int16
	var included, used []int64
	for _, u := range usage {
		for _, pct := range ta.thresholds {
			if !crossed(u, pct) {
				continue
			}
			id, err := uuid.NewV7()
			if err != nil {
				return fmt.Errorf("alert event id: %w", err)
			}
			ids, meters, periods, pcts = append(ids, id), append(meters, u.Meter), append(periods, u.PeriodStart), append(pcts, pct)
			included, used = append(included, u.Included), append(used, u.After)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	status := "pending"
	if !ta.hasURL {
		status = "no_endpoint"
	}
	rows, err := tx.Query(ctx, `INSERT INTO alert_events (id, tenant_id, meter, period_start, threshold_percent, included, used, delivery_status)
		SELECT e.id, $1, e.meter, e.period, e.pct, e.included, e.used, $8
		FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::smallint[], $6::bigint[], $7::bigint[])
			AS e (id, meter, period, pct, included, used)
		ORDER BY e.meter, e.period, e.pct
		ON CONFLICT ON CONSTRAINT alert_events_once DO NOTHING
		RETURNING id`, tenantID, ids, meters, periods, pcts, included, used, status)
	if err != nil {
		return fmt.Errorf("record alert events: %w", err)
	}
	var fresh []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return fmt.Errorf("record alert events: %w", err)
		}
		fresh = append(fresh, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("record alert events: %w", err)
	}
	if len(fresh) == 0 || !ta.hasURL || r.river == nil {
		return nil
	}
	params := make([]river.InsertManyParams, len(fresh))
	for i, id := range fresh {
		params[i] = river.InsertManyParams{Args: DeliverArgs{EventID: id}}
	}
	if _, err := r.river.InsertManyTx(ctx, tx, params); err != nil {
		return fmt.Errorf("queue alert deliveries: %w", err)
	}
	return nil
}

// thresholds returns the tenant's thresholds, read through tx when r's
// copy is missing or older than its TTL.
func (r *Recorder) thresholds(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID) (tenantAlerts, error) {
	now := r.now()
	r.mu.Lock()
	ta, ok := r.cache[tenantID]
	r.mu.Unlock()
	if ok && now.Sub(ta.loaded) < r.ttl {
		return ta, nil
	}
	ta = tenantAlerts{loaded: now}
	var err error
	if ta.thresholds, ta.hasURL, err = tenants.AlertSettings(ctx, tx, tenantID); err != nil {
		return ta, err
	}
	r.mu.Lock()
	if len(r.cache) > 100_000 { // bounded: tenants come and go
		clear(r.cache)
	}
	r.cache[tenantID] = ta
	r.mu.Unlock()
	return ta, nil
}

// DeliverArgs asks a worker to deliver one event. Unique by event while it
// waits or runs, so one event never has two delivery jobs; the event row
// (its lease and delivery_status), not the job, is the record.
type DeliverArgs struct {
	EventID uuid.UUID `json:"event_id" river:"unique"`
}

// Kind implements river.JobArgs.
func (DeliverArgs) Kind() string { return "overage.deliver_alert" }

// InsertOpts implements river.JobArgsWithInsertOpts. River's attempts are
// not what ends a delivery: the worker gives up three days (MaxAge) after
// the event, however many attempts that took.
func (DeliverArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:       QueueAlerts,
		MaxAttempts: 10_000,
		UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{
			rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable,
			rivertype.JobStateRunning, rivertype.JobStateScheduled,
		}},
	}
}

// EventID is the external id of an event: "evt_" and its 32 hex digits.
func EventID(id uuid.UUID) string { return "evt_" + hex.EncodeToString(id[:]) }

// ParseEventID reads an external event id.
func ParseEventID(s string) (uuid.UUID, bool) {
	h, ok := strings.CutPrefix(s, "evt_")
	if !ok || len(h) != 32 {
		return uuid.Nil, false
	}
	var id uuid.UUID
	if _, err := hex.Decode(id[:], []byte(h)); err != nil {
		return uuid.Nil, false
	}
	return id, true
}
