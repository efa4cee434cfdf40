package emulator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"github.com/overage-billing/overage"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

const (
	maxStringLength = 100 // event_name and identifier, per Stripe's schema
	maxBodyBytes    = 1 << 20
	timestampPast   = overage.MaxEventAge
	timestampFuture = overage.MaxFutureSkew
)

// meterEventInput is a parsed, validated meter event request.
type meterEventInput struct {
	eventName  string
	identifier string
	customer   string
	value      int64
	timestamp  time.Time
	payload    map[string]string
}

type meterEventJSON struct {
	Object     string            `json:"object"`
	Created    int64             `json:"created"`
	EventName  string            `json:"event_name"`
	Identifier string            `json:"identifier"`
	Livemode   bool              `json:"livemode"`
	Payload    map[string]string `json:"payload"`
	Timestamp  int64             `json:"timestamp"`
}

// handleMeterEvent implements POST /v1/billing/meter_events. The order of
// checks follows what Stripe documents: the account's rate limit and faults
// of the infrastructure first,
// then the idempotency layer (replay, mismatch, in flight), then validation
// (whose failures are not saved under the key), the per-customer concurrency
// limit, and finally the endpoint itself, whose result is saved.
func (e *Emulator) handleMeterEvent(w http.ResponseWriter, r *http.Request, rec *Request, account string, form url.Values, perr *apiError) {
	ctx := r.Context()
	if !e.allowCall(account) {
		e.reply(w, rec, &apiError{status: http.StatusTooManyRequests, Type: "invalid_request_error", Code: "rate_limit",
			Message: "Request rate limit exceeded. Learn more about rate limits here https://stripe.com/docs/rate-limits.",
			outcome: OutcomeRateLimited})
		return
	}

	serverError, rateLimit, lose, blackhole, latency := e.drawFaults(form.Get("payload[stripe_customer_id]"))
	switch {
	case blackhole:
		e.update(rec, func(q *Request) { q.Outcome = OutcomeBlackholed })
		select {
		case <-ctx.Done():
		case <-e.closed:
		}
		e.finish(rec, 0, OutcomeBlackholed)
		dropConnection(w)
		return
	case serverError:
		e.reply(w, rec, &apiError{status: http.StatusInternalServerError, Type: "api_error",
			Message: "An unknown error occurred (injected by the emulator).", outcome: OutcomeFaultServerError})
		return
	case rateLimit:
		e.reply(w, rec, &apiError{status: http.StatusTooManyRequests, Type: "invalid_request_error", Code: "rate_limit",
			Message: "Request rate limit exceeded. Learn more about rate limits here https://stripe.com/docs/rate-limits. (injected by the emulator)",
			outcome: OutcomeFaultRateLimit})
		return
	}
	if perr != nil {
		e.reply(w, rec, perr)
		return
	}

	// Idempotency layer.
	idemKey := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	var sk scopedKey
	if idemKey != "" {
		sk = scopedKey{account: account, key: idemKey}
		fp := fingerprint(r.Method, r.URL.Path, form)
		e.mu.Lock()
		entry := e.idem[sk]
		if entry != nil && e.now().Sub(entry.created) >= e.keyTTL {
			delete(e.idem, sk)
			entry = nil
		}
		switch {
		case entry != nil && entry.fingerprint != fp:
			e.mu.Unlock()
			e.reply(w, rec, &apiError{status: http.StatusBadRequest, Type: "idempotency_error",
				Message: fmt.Sprintf("Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '%s' if you meant to execute a different request.", idemKey),
				outcome: OutcomeIdempotencyError})
			return
		case entry != nil && !entry.done:
			e.mu.Unlock()
			e.reply(w, rec, &apiError{status: http.StatusConflict, Type: "invalid_request_error", Code: "idempotency_key_in_use",
				Message: "There is currently another in-progress request using this idempotency key (that probably means you submitted twice, and the other request is still going through): " + idemKey + ". Please try again later.",
				outcome: OutcomeKeyInUse})
			return
		case entry != nil:
			status, body, header, original := entry.status, entry.body, entry.header, entry.requestID
			e.mu.Unlock()
			for k, v := range header {
				w.Header()[k] = v
			}
			w.Header().Set("Idempotent-Replayed", "true")
			w.Header().Set("Original-Request", original)
			e.finish(rec, status, OutcomeReplayed)
			writeJSON(w, status, body)
			return
		}
		e.idem[sk] = &idemEntry{fingerprint: fp, created: e.now()}
		e.mu.Unlock()
	}
	// forget releases the key without saving: nothing executed.
	forget := func() {
		if idemKey == "" {
			return
		}
		e.mu.Lock()
		if entry := e.idem[sk]; entry != nil && !entry.done {
			delete(e.idem, sk)
		}
		e.mu.Unlock()
	}

	in, verr := e.validateMeterEvent(form)
	if verr != nil {
		forget()
		e.reply(w, rec, verr)
		return
	}

	slot := slotKey{customer: in.customer, eventName: in.eventName}
	e.mu.Lock()
	if e.slots[slot] {
		e.mu.Unlock()
		forget()
		e.reply(w, rec, &apiError{status: http.StatusTooManyRequests, Type: "invalid_request_error", Code: "rate_limit",
			Message: fmt.Sprintf("Too many concurrent requests for customer %s and meter event %s: only one concurrent call per customer per meter is allowed.", in.customer, in.eventName),
			outcome: OutcomeConcurrentRateLimit})
		return
	}
	e.slots[slot] = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.slots, slot)
		e.mu.Unlock()
	}()

	if !e.wait(ctx, latency) {
		forget()
		e.finish(rec, 0, OutcomeClientGone)
		dropConnection(w)
		return
	}

	// The endpoint proper: the identifier rule and the application are one
	// atomic step, and the result is saved under the key in the same step,
	// so a concurrent or later retry can only ever replay it.
	now := e.now()
	idk := scopedKey{account: account, key: in.identifier}
	e.mu.Lock()
	e.purgeExpiredLocked(now)
	var status int
	var body []byte
	var header http.Header
	outcome := OutcomeApplied
	if at, ok := e.identifiers[idk]; ok && now.Sub(at) < e.identifierTTL {
		a := &apiError{status: http.StatusBadRequest, Type: "invalid_request_error",
			Message: fmt.Sprintf("An event already exists with identifier %s.", in.identifier)}
		status, body, outcome = a.status, a.body(), OutcomeAlreadyExists
		header = http.Header{"Stripe-Should-Retry": []string{"false"}}
	} else {
		e.identifiers[idk] = now
		e.events = append(e.events, AppliedEvent{
			Identifier:     in.identifier,
			IdempotencyKey: idemKey,
			Customer:       in.customer,
			EventName:      in.eventName,
			Value:          in.value,
			Timestamp:      in.timestamp,
			AppliedAt:      now,
		})
		e.appliedCount[in.identifier]++
		e.meterForLocked(in.eventName)
		e.seenCustomerLocked(in.customer)
		status = http.StatusOK
		body = mustJSON(meterEventJSON{
			Object:     "billing.meter_event",
			Created:    now.Unix(),
			EventName:  in.eventName,
			Identifier: in.identifier,
			Payload:    in.payload,
			Timestamp:  in.timestamp.Unix(),
		})
	}
	if idemKey != "" {
		if entry := e.idem[sk]; entry != nil {
			entry.done, entry.status, entry.body, entry.header, entry.requestID = true, status, body, header, rec.RequestID
		}
	}
	e.mu.Unlock()
	if outcome == OutcomeApplied {
		e.wait(ctx, e.answerDelay()) // applied whether or not the client waits
	}

	if outcome == OutcomeApplied && lose {
		e.finish(rec, 0, OutcomeLostResponse)
		dropConnection(w)
		return
	}
	for k, v := range header {
		w.Header()[k] = v
	}
	e.finish(rec, status, outcome)
	writeJSON(w, status, body)
}

// reply writes an error that is not saved under the idempotency key.
func (e *Emulator) reply(w http.ResponseWriter, rec *Request, a *apiError) {
	outcome := a.outcome
	if outcome == "" {
		outcome = OutcomeInvalid
	}
	e.finish(rec, a.status, outcome)
	writeJSON(w, a.status, a.body())
}

// wait sleeps for d unless the client leaves or the emulator closes first.
func (e *Emulator) wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-e.closed:
		return false
	}
}

func parseForm(w http.ResponseWriter, r *http.Request) (url.Values, *apiError) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/x-www-form-urlencoded" {
		return url.Values{}, invalidRequest("", "",
			"Invalid request: unsupported Content-Type %q. If error persists and you need assistance, please contact support@stripe.com.",
			r.Header.Get("Content-Type"))
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
	if err := r.ParseForm(); err != nil {
		return url.Values{}, invalidRequest("", "", "Invalid request body: %v", err)
	}
	return r.PostForm, nil
}

// fingerprint identifies a request's parameters for the idempotency layer;
// url.Values.Encode sorts keys, so parameter order does not matter.
func fingerprint(method, path string, form url.Values) string {
	sum := sha256.Sum256([]byte(method + " " + path + "\n" + form.Encode()))
	return hex.EncodeToString(sum[:])
}

func (e *Emulator) validateMeterEvent(form url.Values) (*meterEventInput, *apiError) {
	in := &meterEventInput{payload: make(map[string]string)}
	for key, vals := range form {
		switch {
		case key == "event_name", key == "identifier", key == "timestamp":
		case strings.HasPrefix(key, "expand["), key == "expand":
		case strings.HasPrefix(key, "payload[") && strings.HasSuffix(key, "]") && len(key) > len("payload[]"):
			in.payload[key[len("payload["):len(key)-1]] = vals[0]
		default:
			return nil, invalidRequest("parameter_unknown", key, "Received unknown parameter: %s", key)
		}
	}

	in.eventName = form.Get("event_name")
	if in.eventName == "" {
		return nil, invalidRequest("parameter_missing", "event_name", "Missing required param: event_name.")
	}
	if len(in.eventName) > maxStringLength {
		return nil, invalidRequest("", "event_name", "Invalid string: %s...; must be at most %d characters", in.eventName[:20], maxStringLength)
	}

	in.identifier = form.Get("identifier")
	if len(in.identifier) > maxStringLength {
		return nil, invalidRequest("", "identifier", "Invalid string: %s...; must be at most %d characters", in.identifier[:20], maxStringLength)
	}
	if !form.Has("identifier") {
		// Stripe generates one; ours are unique within the emulator.
		in.identifier = "emu_" + strconv.FormatInt(e.now().UnixNano(), 36) + "_" + strconv.FormatUint(e.nextSeq(), 36)
	} else if in.identifier == "" {
		return nil, invalidRequest("parameter_invalid_empty", "identifier", "You passed an empty string for 'identifier'. We assume empty values are an attempt to unset a parameter; however 'identifier' cannot be unset. You should remove 'identifier' from your request or supply a non-empty value.")
	}

	now := e.now()
	in.timestamp = time.Unix(now.Unix(), 0).UTC()
	if form.Has("timestamp") {
		ts, err := strconv.ParseInt(form.Get("timestamp"), 10, 64)
		if err != nil {
			return nil, invalidRequest("parameter_invalid_integer", "timestamp", "Invalid integer: %s", form.Get("timestamp"))
		}
		in.timestamp = time.Unix(ts, 0).UTC()
		if in.timestamp.Before(now.Add(-timestampPast)) {
			return nil, invalidRequest("", "timestamp", "Timestamp must be within the past 35 calendar days.")
		}
		if in.timestamp.After(now.Add(timestampFuture)) {
			return nil, invalidRequest("", "timestamp", "Timestamp must not be more than 5 minutes in the future.")
		}
	}

	if !form.Has("payload[stripe_customer_id]") && len(in.payload) == 0 {
		return nil, invalidRequest("parameter_missing", "payload", "Missing required param: payload.")
	}
	in.customer = in.payload["stripe_customer_id"]
	if in.customer == "" {
		return nil, invalidRequest("parameter_missing", "payload[stripe_customer_id]", "Missing required param: payload[stripe_customer_id].")
	}
	raw, ok := in.payload["value"]
	if !ok || raw == "" {
		return nil, invalidRequest("parameter_missing", "payload[value]", "Missing required param: payload[value].")
	}
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return nil, invalidRequest("parameter_invalid_integer", "payload[value]", "Invalid integer: %s; payload[value] must be a whole number.", raw)
	}
	in.value = v

	e.mu.Lock()
	known := (e.customers == nil || e.customers[in.customer]) && !e.deletedCustomers[in.customer]
	failMsg := e.failCustomers[in.customer]
	e.mu.Unlock()
	if !known {
		a := invalidRequest("resource_missing", "payload[stripe_customer_id]", "No such customer: '%s'", in.customer)
		a.outcome = OutcomeUnknownCustomer
		return nil, a
	}
	if failMsg != "" {
		a := invalidRequest("", "payload[stripe_customer_id]", "%s", failMsg)
		a.outcome = OutcomeCustomerFailure
		return nil, a
	}
	return in, nil
}

func (e *Emulator) nextSeq() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reqSeq++
	return e.reqSeq
}

// purgeExpiredLocked forgets expired keys and identifiers now and then, so a
// long-running emulator (overage dev) does not keep them forever. Lookups
// check expiry themselves; this only bounds memory.
func (e *Emulator) purgeExpiredLocked(now time.Time) {
	e.applies++
	if e.applies%1024 != 0 {
		return
	}
	for k, entry := range e.idem {
		if entry.done && now.Sub(entry.created) >= e.keyTTL {
			delete(e.idem, k)
		}
	}
	for k, at := range e.identifiers {
		if now.Sub(at) >= e.identifierTTL {
			delete(e.identifiers, k)
		}
	}
}
