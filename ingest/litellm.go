package ingest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/overage-billing/overage"
)

// POST /v1/integrations/litellm takes the deliveries of LiteLLM's generic
// logging callback: a JSON list of its StandardLoggingPayload objects (its
// log_format json_array; single and ndjson are taken too). Each payload of a successful
// call becomes a usage event of a batch — its id as request_id, model as
// model_id, prompt_tokens and completion_tokens as the token counts,
// end_user as user_id, endTime as the timestamp — and the answer is the
// batch answer. Failed calls (status other than "success", or an error
// without status) and calls with no tokens are skipped.
//
// LiteLLM sends no Idempotency-Key of its own, and a static header would
// name every delivery alike, so the key is derived from the ids of the
// payloads recorded: a redelivery of the same list is replayed byte for
// byte, and one regrouped differently bills nothing twice because every
// event carries its request_id. The fingerprint is over the events derived,
// not LiteLLM's whole body, so a field overage does not read cannot turn a
// redelivery into a key reuse.

const (
	// maxLiteLLMBytes bounds a delivery: LiteLLM's payloads carry the
	// messages and the response, so they are much larger than our events.
	maxLiteLLMBytes = 32 << 20
	litellmPath     = "/v1/integrations/litellm"
)

// litellmPayload is the part of LiteLLM's StandardLoggingPayload that
// overage reads; the other fields are ignored.
type litellmPayload struct {
	ID               string          `json:"id"`
	Status           string          `json:"status"`
	ErrorStr         *string         `json:"error_str"`
	Model            string          `json:"model"`
	PromptTokens     json.RawMessage `json:"prompt_tokens"`
	CompletionTokens json.RawMessage `json:"completion_tokens"`
	EndUser          *string         `json:"end_user"`
	StartTime        *float64        `json:"startTime"`
	EndTime          *float64        `json:"endTime"`
	Metadata         struct {
		UserAPIKeyUserID *string `json:"user_api_key_user_id"`
		UserAPIKeyTeamID *string `json:"user_api_key_team_id"`
		// UsageObject is the call's usage as LiteLLM normalised it (an
		// OpenAI usage object): its cached and reasoning counts.
		UsageObject *litellmUsage `json:"usage_object"`
	} `json:"metadata"`
}

// litellmUsage is the part of LiteLLM's usage object with the parts of
// the totals: cache reads as OpenAI reports them
// (prompt_tokens_details.cached_tokens) or as Anthropic does
// (cache_read_input_tokens), cache writes (cache_creation_input_tokens),
// reasoning (completion_tokens_details.reasoning_tokens).
type litellmUsage struct {
	CacheRead           *int64 `json:"cache_read_input_tokens"`
	CacheCreation       *int64 `json:"cache_creation_input_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens *int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

// parts are the usage object's parts of the totals in and out. A count
// that is negative or does not fit in its total is left out rather than
// refusing the call: LiteLLM's normalisation differs by provider and
// version, and the totals are what the call is billed by anyway.
func (u *litellmUsage) parts(in, out int64) (read, write, reasoning *int64) {
	if u == nil {
		return nil, nil, nil
	}
	read = u.CacheRead
	if d := u.PromptTokensDetails; d != nil && d.CachedTokens != nil && *d.CachedTokens > 0 {
		read = d.CachedTokens
	}
	write = u.CacheCreation
	if d := u.CompletionTokensDetails; d != nil {
		reasoning = d.ReasoningTokens
	}
	fits := func(p *int64, room int64) *int64 {
		if p == nil || *p <= 0 || *p > room {
			return nil
		}
		return p
	}
	read = fits(read, in)
	room := in
	if read != nil {
		room -= *read
	}
	return read, fits(write, room), fits(reasoning, out)
}

// litellmEvent is the usage event made of one payload, in the batch
// event's JSON.
type litellmEvent struct {
	RequestID    string          `json:"request_id"`
	Timestamp    string          `json:"timestamp,omitempty"`
	UserID       string          `json:"user_id"`
	ModelID      string          `json:"model_id"`
	InputTokens  json.RawMessage `json:"input_tokens"`
	OutputTokens json.RawMessage `json:"output_tokens"`
	CacheRead    *int64          `json:"cache_read_input_tokens,omitempty"`
	CacheWrite   *int64          `json:"cache_creation_input_tokens,omitempty"`
	Reasoning    *int64          `json:"reasoning_output_tokens,omitempty"`
}

// litellmFields names, for an event field, the payload field it came from.
var litellmFields = map[string]string{
	"request_id": "id", "timestamp": "endTime", "user_id": "end_user", "model_id": "model",
	"input_tokens": "prompt_tokens", "output_tokens": "completion_tokens",
}

func (h *Handler) createLiteLLM(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, h.recordLiteLLM)
}

// recordLiteLLM runs ingest's checks in order — authenticate, validate,
// fingerprint, then the key — on the events derived from the payloads.
func (h *Handler) recordLiteLLM(r *http.Request) (*Outcome, error) {
	caller, err := h.writer(r)
	if err != nil {
		return nil, err
	}
	tenantID := caller.TenantID
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return nil, malformed("Content-Type", "must be application/json")
		}
	}
	body, err := readAll(http.MaxBytesReader(nil, r.Body, maxLiteLLMBytes), r.ContentLength, maxLiteLLMBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, overage.Errorf(overage.ETOOLARGE, "payload-too-large", "the body is over %d bytes", maxLiteLLMBytes)
		}
		return nil, malformed("body", "could not read the request body")
	}
	events, origin, err := litellmEvents(body)
	if err != nil {
		return nil, err
	}
	if len(events) == 0 {
		// Every call failed or used no tokens: nothing to record.
		return &Outcome{Kind: OutcomeNew, Status: http.StatusOK, Body: []byte(`{"events":[],"created":0,"duplicates":0}`)}, nil
	}
	batch, err := json.Marshal(struct {
		Events []litellmEvent `json:"events"`
	}{events})
	if err != nil {
		return nil, fmt.Errorf("litellm: encode events: %w", err)
	}
	parsed, err := parseBatch(batch, h.now(), tenantID)
	if err != nil {
		return nil, renameLiteLLMFields(err, origin)
	}
	fp, err := fingerprint(http.MethodPost, litellmPath, batch)
	if err != nil {
		return nil, malformed("body", err.Error())
	}
	return h.svc.RecordBatch(r.Context(), BatchParams{TenantID: tenantID, Key: litellmKey(events), Fingerprint: fp, Events: parsed})
}

// litellmEvents decodes a delivery and returns the events of its
// successful calls, with the index in the delivery of each.
func litellmEvents(body []byte) ([]litellmEvent, []int, error) {
	trimmed := bytes.TrimSpace(body)
	var payloads []litellmPayload
	var err error
	if len(trimmed) > 0 && trimmed[0] == '{' {
		// log_format single (one object) or ndjson (one per line).
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		for err == nil {
			var p litellmPayload
			if err = dec.Decode(&p); err == nil {
				payloads = append(payloads, p)
			}
		}
		if errors.Is(err, io.EOF) {
			err = nil
		}
	} else {
		err = json.Unmarshal(trimmed, &payloads)
	}
	if err != nil {
		return nil, nil, malformed("body", fmt.Sprintf("the body must be a JSON list of LiteLLM StandardLoggingPayload objects: %v", err))
	}
	var (
		events []litellmEvent
		origin []int
		fields []overage.FieldError
	)
	for i, p := range payloads {
		if !litellmSucceeded(p) || (isZero(p.PromptTokens) && isZero(p.CompletionTokens)) {
			continue
		}
		ev := litellmEvent{RequestID: p.ID, ModelID: p.Model, UserID: litellmUser(p),
			InputTokens: orZero(p.PromptTokens), OutputTokens: orZero(p.CompletionTokens)}
		// The parts only when the totals are plain integers; anything else
		// is refused below by the batch's own checks, naming the field.
		if in, err := strconv.ParseInt(string(ev.InputTokens), 10, 64); err == nil {
			if out, err := strconv.ParseInt(string(ev.OutputTokens), 10, 64); err == nil {
				ev.CacheRead, ev.CacheWrite, ev.Reasoning = p.Metadata.UsageObject.parts(in, out)
			}
		}
		if at := p.EndTime; at != nil || p.StartTime != nil {
			if at == nil {
				at = p.StartTime
			}
			if math.IsNaN(*at) || math.IsInf(*at, 0) || *at <= 0 || *at > 1e11 {
				fields = append(fields, overage.FieldError{Field: fmt.Sprintf("[%d].endTime", i), Detail: "must be Unix seconds"})
				continue
			}
			sec, frac := math.Modf(*at)
			ev.Timestamp = time.Unix(int64(sec), int64(frac*1e9)).UTC().Format(time.RFC3339Nano)
		}
		events, origin = append(events, ev), append(origin, i)
	}
	if len(fields) > 0 {
		return nil, nil, overage.Invalid(fields, "the LiteLLM payloads are invalid: %s", describe(fields))
	}
	if len(events) > MaxBatchEvents {
		detail := fmt.Sprintf("must hold at most %d successful calls, got %d", MaxBatchEvents, len(events))
		return nil, nil, overage.Invalid([]overage.FieldError{{Field: "body", Detail: detail}}, "the delivery %s", detail)
	}
	return events, origin, nil
}

// litellmSucceeded: status "success", or, from a LiteLLM too old to send a
// status, no error.
func litellmSucceeded(p litellmPayload) bool {
	if p.Status != "" {
		return p.Status == "success"
	}
	return p.ErrorStr == nil || *p.ErrorStr == ""
}

// litellmUser is who the call is billed to within the tenant: end_user
// (the "user" of the request), else the LiteLLM key's user or team, else
// "litellm".
func litellmUser(p litellmPayload) string {
	for _, s := range []*string{p.EndUser, p.Metadata.UserAPIKeyUserID, p.Metadata.UserAPIKeyTeamID} {
		if s != nil && strings.TrimSpace(*s) != "" {
			return *s
		}
	}
	return "litellm"
}

func isZero(n json.RawMessage) bool {
	s := string(bytes.TrimSpace(n))
	return s == "" || s == "null" || s == "0"
}

func orZero(n json.RawMessage) json.RawMessage {
	if s := string(bytes.TrimSpace(n)); s == "" || s == "null" {
		return json.RawMessage("0")
	}
	return n
}

// litellmKey is the Idempotency-Key of a delivery: derived from the ids it
// records, in order, so a redelivery carries the same key.
func litellmKey(events []litellmEvent) string {
	h := sha256.New()
	for _, e := range events {
		h.Write([]byte(strconv.Itoa(len(e.RequestID))))
		h.Write([]byte{':'})
		h.Write([]byte(e.RequestID))
	}
	return "litellm:" + hex.EncodeToString(h.Sum(nil))
}

var eventField = regexp.MustCompile(`^events\[(\d+)\]\.(\w+)$`)

// renameLiteLLMFields names the fields of a validation error as the
// delivery's: events[1].input_tokens becomes [3].prompt_tokens when the
// second event came from the fourth payload.
func renameLiteLLMFields(err error, origin []int) error {
	var e *overage.Error
	if !errors.As(err, &e) || len(e.Fields) == 0 {
		return err
	}
	out := *e
	out.Fields = make([]overage.FieldError, len(e.Fields))
	for i, f := range e.Fields {
		out.Fields[i] = f
		m := eventField.FindStringSubmatch(f.Field)
		if m == nil {
			continue
		}
		idx, _ := strconv.Atoi(m[1])
		name := m[2]
		if n, ok := litellmFields[name]; ok {
			name = n
		}
		if idx < len(origin) {
			out.Fields[i].Field = fmt.Sprintf("[%d].%s", origin[idx], name)
		}
	}
	out.Message = "the LiteLLM payloads are invalid: " + describe(out.Fields)
	return &out
}
