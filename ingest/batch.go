package ingest

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/fastjson"
)

const (
	// MaxBatchEvents is the most events one batch request may carry.
	MaxBatchEvents = 1000
	maxBatchBytes  = 1 << 20
)

// parseBatch decodes and validates a batch body {"events": [...]}: through
// fastjson.ParseBatch when it understands the body, else
// parseBatchViaDecoder.
func parseBatch(body []byte, now time.Time, tenantID uuid.UUID) ([]*Event, error) {
	rules := fastRules(now, tenantID)
	if evs, ok := fastjson.ParseBatch(body, &rules, setFromFast); ok {
		return pointers(evs), nil
	}
	return parseBatchViaDecoder(body, now, tenantID)
}

// pointers points to each of evs.
func pointers(evs []Event) []*Event {
	events := make([]*Event, len(evs))
	for i := range evs {
		events[i] = &evs[i]
	}
	return events
}

// parseBatchViaDecoder decodes and validates a batch body, all or
// nothing: every problem of every event is reported at once, named
// events[<index>].<field>. Syntax problems (malformed JSON, an event that
// is not an object, unknown fields) make it EMALFORMED (400), anything
// else EINVALID (422). Every event must carry a request_id, unique in the
// batch, so a client that regroups a failed batch under a new key can never
// have an event recorded twice.
func parseBatchViaDecoder(body []byte, now time.Time, tenantID uuid.UUID) ([]*Event, error) {
	raw, err := decodeObject(body, `the body must be a JSON object {"events": [...]}`)
	if err != nil {
		return nil, err
	}
	if err := refuseUnknown(raw, func(k string) bool { return k == "events" }); err != nil {
		return nil, err
	}
	var items []json.RawMessage
	if v, ok := raw["events"]; !ok || string(v) == "null" {
		return nil, overage.Invalid([]overage.FieldError{{Field: "events", Detail: "is required"}}, "events is required")
	} else if err := json.Unmarshal(v, &items); err != nil {
		return nil, malformed("events", "must be an array of usage events")
	}
	if len(items) == 0 || len(items) > MaxBatchEvents {
		detail := fmt.Sprintf("must hold 1 to %d events, got %d", MaxBatchEvents, len(items))
		return nil, overage.Invalid([]overage.FieldError{{Field: "events", Detail: detail}}, "events %s", detail)
	}

	events := make([]*Event, len(items))
	var fields []overage.FieldError
	syntax := false
	firstIndex := map[string]int{}
	named := map[int]bool{} // indexes already named for a repeated request_id
	for i, item := range items {
		prefix := fmt.Sprintf("events[%d].", i)
		ev, err := parseEventViaDecoder(item, now)
		if err != nil {
			e := overage.AsError(err)
			if e.Code == overage.EMALFORMED {
				syntax = true
			}
			if len(e.Fields) == 0 {
				fields = append(fields, overage.FieldError{Field: strings.TrimSuffix(prefix, "."), Detail: e.Message})
			}
			for _, f := range e.Fields {
				field := prefix + f.Field
				if f.Field == "body" { // the event itself is not a JSON object
					field = strings.TrimSuffix(prefix, ".")
				}
				fields = append(fields, overage.FieldError{Field: field, Detail: f.Detail})
			}
			continue
		}
		events[i] = ev
		if ev.Stream != nil {
			// A checkpoint's answer (stale, stream totals) has no place in a
			// batch answer: checkpoints go to POST /v1/usage-events.
			fields = append(fields, overage.FieldError{Field: prefix + "stream", Detail: "stream checkpoints are sent one at a time to POST /v1/usage-events"})
			continue
		}
		if ev.TenantID != nil && *ev.TenantID != tenantID {
			return nil, overage.Errorf(overage.EFORBIDDEN, "tenant-mismatch", "events[%d].tenant_id names a tenant other than the API key's", i)
		}
		if ev.RequestID == nil {
			fields = append(fields, overage.FieldError{Field: prefix + "request_id", Detail: "is required in a batch"})
			continue
		}
		if j, ok := firstIndex[*ev.RequestID]; ok {
			if !named[j] {
				named[j] = true
				fields = append(fields, overage.FieldError{Field: fmt.Sprintf("events[%d].request_id", j), Detail: "is repeated in the batch"})
			}
			fields = append(fields, overage.FieldError{Field: prefix + "request_id", Detail: fmt.Sprintf("repeats events[%d].request_id", j)})
			continue
		}
		firstIndex[*ev.RequestID] = i
	}
	if len(fields) > 0 {
		if syntax {
			e := overage.Errorf(overage.EMALFORMED, "malformed-request", "the batch is malformed: %s", describe(fields))
			e.Fields = fields
			return nil, e
		}
		return nil, overage.Invalid(fields, "the batch is invalid, nothing was recorded: %s", describe(fields))
	}
	return events, nil
}
