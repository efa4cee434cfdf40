package emulator

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// Customers. The emulator knows a customer it was told of (Options.Customers,
// AddCustomer), one it created (POST /v1/customers) and one a meter event
// it applied named, since tests bill customers without creating them
// first. GET /v1/customers/{id} answers a known customer, a deleted one
// as Stripe does (200 with "deleted": true), and any other with 404
// resource_missing.

// customerJSON follows stripe-go v79's stripe.Customer, in part.
type customerJSON struct {
	ID       string `json:"id"`
	Object   string `json:"object"`
	Created  int64  `json:"created,omitempty"`
	Name     string `json:"name,omitempty"`
	Email    string `json:"email,omitempty"`
	Livemode bool   `json:"livemode"`
	Deleted  bool   `json:"deleted,omitempty"`
}

// AddCustomer makes id a customer the emulator knows, as if created in
// Stripe's dashboard.
func (e *Emulator) AddCustomer(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.knownCustomers[id] = true
	delete(e.deletedCustomers, id)
}

// DeleteCustomer deletes a customer, as Stripe's dashboard does: GET then
// answers it with "deleted": true. (Stripe sends customer.deleted; the
// emulator sends no webhooks.)
func (e *Emulator) DeleteCustomer(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.knownCustomers, id)
	e.deletedCustomers[id] = true
}

// seenCustomerLocked records a customer a meter event named.
func (e *Emulator) seenCustomerLocked(id string) {
	if !e.deletedCustomers[id] {
		e.knownCustomers[id] = true
	}
}

func (e *Emulator) customerKnownLocked(id string) bool {
	return e.knownCustomers[id] || (e.customers != nil && e.customers[id] && !e.deletedCustomers[id])
}

func noSuchCustomer(id string) *apiError {
	return &apiError{status: http.StatusNotFound, Type: "invalid_request_error", Code: "resource_missing",
		Param: "id", Message: fmt.Sprintf("No such customer: '%s'", id), outcome: OutcomeNotFound}
}

func (e *Emulator) handleGetCustomer(w http.ResponseWriter, r *http.Request, rec *Request, id string) {
	if a := onlyParams(r.URL.Query(), "expand"); a != nil {
		e.reply(w, rec, a)
		return
	}
	e.mu.Lock()
	known, deleted := e.customerKnownLocked(id), e.deletedCustomers[id]
	e.mu.Unlock()
	switch {
	case deleted:
		e.finish(rec, http.StatusOK, OutcomeOK)
		writeJSON(w, http.StatusOK, mustJSON(customerJSON{ID: id, Object: "customer", Deleted: true}))
	case known:
		e.finish(rec, http.StatusOK, OutcomeOK)
		writeJSON(w, http.StatusOK, mustJSON(customerJSON{ID: id, Object: "customer"}))
	default:
		e.reply(w, rec, noSuchCustomer(id))
	}
}

// handleCreateCustomer creates a customer with a new id (Stripe does not
// let the caller choose one).
func (e *Emulator) handleCreateCustomer(w http.ResponseWriter, rec *Request, form url.Values, perr *apiError) {
	if perr != nil {
		e.reply(w, rec, perr)
		return
	}
	id := "cus_emu" + strconv.FormatUint(e.nextSeq(), 36) + strconv.FormatInt(e.now().UnixNano()%1e6, 36)
	e.AddCustomer(id)
	e.finish(rec, http.StatusOK, OutcomeOK)
	writeJSON(w, http.StatusOK, mustJSON(customerJSON{ID: id, Object: "customer", Created: e.now().Unix(),
		Name: form.Get("name"), Email: form.Get("email")}))
}
