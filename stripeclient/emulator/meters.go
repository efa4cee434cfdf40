package emulator

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Field names follow stripe-go v79's stripe.BillingMeter and
// stripe.BillingMeterEventSummary.
type meterJSON struct {
	ID                 string `json:"id"`
	Object             string `json:"object"`
	Created            int64  `json:"created"`
	CustomerMapping    any    `json:"customer_mapping"`
	DefaultAggregation any    `json:"default_aggregation"`
	DisplayName        string `json:"display_name"`
	EventName          string `json:"event_name"`
	EventTimeWindow    any    `json:"event_time_window"`
	Livemode           bool   `json:"livemode"`
	Status             string `json:"status"`
	StatusTransitions  any    `json:"status_transitions"`
	Updated            int64  `json:"updated"`
	ValueSettings      any    `json:"value_settings"`
}

type eventSummaryJSON struct {
	ID              string  `json:"id"`
	Object          string  `json:"object"`
	AggregatedValue float64 `json:"aggregated_value"`
	EndTime         int64   `json:"end_time"`
	Livemode        bool    `json:"livemode"`
	Meter           string  `json:"meter"`
	StartTime       int64   `json:"start_time"`
}

type listJSON[T any] struct {
	Object  string `json:"object"`
	Data    []T    `json:"data"`
	HasMore bool   `json:"has_more"`
	URL     string `json:"url"`
}

func (m *meter) json() meterJSON {
	return meterJSON{
		ID:                 m.id,
		Object:             "billing.meter",
		Created:            m.created,
		CustomerMapping:    map[string]string{"event_payload_key": "stripe_customer_id", "type": "by_id"},
		DefaultAggregation: map[string]string{"formula": "sum"},
		DisplayName:        m.eventName,
		EventName:          m.eventName,
		Status:             "active",
		StatusTransitions:  map[string]any{"deactivated_at": nil},
		Updated:            m.created,
		ValueSettings:      map[string]string{"event_payload_key": "value"},
	}
}

func (e *Emulator) handleListMeters(w http.ResponseWriter, r *http.Request, rec *Request) {
	q := r.URL.Query()
	if a := onlyParams(q, "limit", "starting_after", "ending_before", "status", "expand"); a != nil {
		e.reply(w, rec, a)
		return
	}
	var all []meterJSON
	for _, m := range e.metersNewestFirst() {
		if s := q.Get("status"); s != "" && s != "active" {
			continue
		}
		all = append(all, m.json())
	}
	page, more, a := paginate(all, func(m meterJSON) string { return m.ID }, q)
	if a != nil {
		e.reply(w, rec, a)
		return
	}
	e.finish(rec, http.StatusOK, OutcomeOK)
	writeJSON(w, http.StatusOK, mustJSON(listJSON[meterJSON]{Object: "list", Data: page, HasMore: more, URL: "/v1/billing/meters"}))
}

func (e *Emulator) handleGetMeter(w http.ResponseWriter, r *http.Request, rec *Request, id string) {
	m := e.meterByID(id)
	if m == nil {
		e.reply(w, rec, noSuchMeter(id))
		return
	}
	e.finish(rec, http.StatusOK, OutcomeOK)
	writeJSON(w, http.StatusOK, mustJSON(m.json()))
}

// handleEventSummaries aggregates applied events by their own timestamp
// (not when they were received), over [start_time, end_time), in one window
// or per hour or day, returned in ascending time order. Unlike Stripe,
// which aggregates asynchronously, it reflects every applied event at once.
func (e *Emulator) handleEventSummaries(w http.ResponseWriter, r *http.Request, rec *Request, id string) {
	q := r.URL.Query()
	if a := onlyParams(q, "customer", "start_time", "end_time", "value_grouping_window", "limit", "starting_after", "ending_before", "expand"); a != nil {
		e.reply(w, rec, a)
		return
	}
	m := e.meterByID(id)
	if m == nil {
		e.reply(w, rec, noSuchMeter(id))
		return
	}
	customer := q.Get("customer")
	if customer == "" {
		e.reply(w, rec, invalidRequest("parameter_missing", "customer", "Missing required param: customer."))
		return
	}
	start, a := unixParam(q, "start_time")
	if a != nil {
		e.reply(w, rec, a)
		return
	}
	end, a := unixParam(q, "end_time")
	if a != nil {
		e.reply(w, rec, a)
		return
	}
	if start >= end {
		e.reply(w, rec, invalidRequest("", "end_time", "end_time must be after start_time."))
		return
	}
	var step int64
	switch g := q.Get("value_grouping_window"); g {
	case "":
		step = end - start
	case "hour":
		step = 3600
	case "day":
		step = 86400
	default:
		e.reply(w, rec, invalidRequest("", "value_grouping_window", "Invalid value_grouping_window: must be one of hour or day"))
		return
	}
	align := int64(60)
	if q.Get("value_grouping_window") != "" {
		align = step
	}
	if start%align != 0 || end%align != 0 {
		e.reply(w, rec, invalidRequest("", "start_time",
			"start_time and end_time must be aligned to %d-second boundaries for this value_grouping_window.", align))
		return
	}

	sums := make(map[int64]int64)
	for _, ev := range e.Events() {
		ts := ev.Timestamp.Unix()
		if ev.EventName != m.eventName || ev.Customer != customer || ts < start || ts >= end {
			continue
		}
		sums[start+(ts-start)/step*step] += ev.Value
	}
	var all []eventSummaryJSON
	for ws := start; ws < end; ws += step {
		we := min(ws+step, end)
		h := sha256.Sum256(fmt.Appendf(nil, "%s|%s|%d|%d", m.id, customer, ws, we))
		all = append(all, eventSummaryJSON{
			ID:              "mtrusg_" + hex.EncodeToString(h[:12]),
			Object:          "billing.meter_event_summary",
			AggregatedValue: float64(sums[ws]),
			StartTime:       ws,
			EndTime:         we,
			Meter:           m.id,
		})
	}
	page, more, a := paginate(all, func(s eventSummaryJSON) string { return s.ID }, q)
	if a != nil {
		e.reply(w, rec, a)
		return
	}
	e.finish(rec, http.StatusOK, OutcomeOK)
	writeJSON(w, http.StatusOK, mustJSON(listJSON[eventSummaryJSON]{Object: "list", Data: page, HasMore: more,
		URL: "/v1/billing/meters/" + m.id + "/event_summaries"}))
}

func (e *Emulator) meterByID(id string) *meter {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.meterIDs[id]
}

func noSuchMeter(id string) *apiError {
	return &apiError{status: http.StatusNotFound, Type: "invalid_request_error", Code: "resource_missing",
		Param: "id", Message: fmt.Sprintf("No such billing meter: '%s'", id), outcome: OutcomeNotFound}
}

func unixParam(q url.Values, name string) (int64, *apiError) {
	raw := q.Get(name)
	if raw == "" {
		return 0, invalidRequest("parameter_missing", name, "Missing required param: %s.", name)
	}
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return 0, invalidRequest("parameter_invalid_integer", name, "Invalid integer: %s", raw)
	}
	return v, nil
}

// onlyParams rejects parameters the endpoint does not know, as Stripe does.
func onlyParams(q url.Values, allowed ...string) *apiError {
	for key := range q {
		name := key
		if i := strings.IndexByte(key, '['); i > 0 {
			name = key[:i]
		}
		ok := false
		for _, a := range allowed {
			ok = ok || a == name
		}
		if !ok {
			return invalidRequest("parameter_unknown", key, "Received unknown parameter: %s", key)
		}
	}
	return nil
}

// paginate applies Stripe's cursor pagination (limit, starting_after,
// ending_before) to items in list order.
func paginate[T any](items []T, id func(T) string, q url.Values) ([]T, bool, *apiError) {
	limit := 10
	if raw := q.Get("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > 100 {
			return nil, false, invalidRequest("", "limit", "Invalid limit: must be an integer between 1 and 100.")
		}
		limit = n
	}
	index := func(cursor string) (int, *apiError) {
		for i, it := range items {
			if id(it) == cursor {
				return i, nil
			}
		}
		return 0, invalidRequest("resource_missing", "", "No such object: '%s'", cursor)
	}
	if after := q.Get("starting_after"); after != "" {
		i, a := index(after)
		if a != nil {
			return nil, false, a
		}
		rest := items[i+1:]
		if len(rest) > limit {
			return rest[:limit], true, nil
		}
		return rest, false, nil
	}
	if before := q.Get("ending_before"); before != "" {
		i, a := index(before)
		if a != nil {
			return nil, false, a
		}
		from := max(0, i-limit)
		return items[from:i], from > 0, nil
	}
	if len(items) > limit {
		return items[:limit], true, nil
	}
	if items == nil {
		items = []T{}
	}
	return items, false, nil
}
