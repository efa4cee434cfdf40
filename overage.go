// Package overage holds the domain vocabulary of the usage-billing pipeline:
// tenants, usage logs, billing statuses, token dimensions and the one
// application error type. Every other package imports it; it imports none of
// them, so the words mean the same thing from the HTTP edge to the Stripe
// worker.
package overage

import (
	"time"

	"github.com/google/uuid"
)

// BillingStatus is where a usage log stands with Stripe.
type BillingStatus string

const (
	// BillingStatusPending: overage recorded, not yet accepted by Stripe.
	BillingStatusPending BillingStatus = "pending"
	// BillingStatusBilled: every dimension with overage was accepted by Stripe.
	BillingStatusBilled BillingStatus = "billed"
	// BillingStatusNotBillable: no overage in any dimension; never sent.
	BillingStatusNotBillable BillingStatus = "not_billable"
	// BillingStatusNeedsReview: first send is older than Stripe's idempotency
	// window; an automatic resend could bill twice, so an operator decides.
	BillingStatusNeedsReview BillingStatus = "needs_review"
	// BillingStatusFailed: Stripe refused it with an error retrying cannot fix.
	BillingStatusFailed BillingStatus = "failed"
)

// Dimension is one billed quantity of a usage log.
type Dimension string

const (
	DimensionInput  Dimension = "input"
	DimensionOutput Dimension = "output"
)

// Dimensions lists every dimension in a fixed order.
var Dimensions = []Dimension{DimensionInput, DimensionOutput}

// Tenant is a customer of the product: one Stripe customer, one allowance.
type Tenant struct {
	ID                   uuid.UUID `json:"id"`
	Name                 string    `json:"name"`
	StripeCustomerID     string    `json:"stripe_customer_id"`
	IncludedInputTokens  int64     `json:"included_input_tokens"`
	IncludedOutputTokens int64     `json:"included_output_tokens"`
	// Included is the allowance per meter key: "input" and "output" are
	// the two fields above, the other meters' come from included_meters.
	Included  map[string]int64 `json:"included"`
	CreatedAt time.Time        `json:"created_at"`
}

// Principal is who a tenant API key speaks for, as one lookup of the key
// reads it: the tenant, the key (recorded on what the key changes, such as
// a correction's corrected_by) and whether the tenant is suspended (its
// Stripe customer was deleted, so nothing it sends could be billed).
type Principal struct {
	TenantID  uuid.UUID
	KeyID     uuid.UUID
	Suspended bool
}

// UsageLog is one recorded LLM call and what of it is billable overage.
type UsageLog struct {
	ID           uuid.UUID `json:"id"`
	TenantID     uuid.UUID `json:"tenant_id"`
	RequestID    *string   `json:"request_id"`
	Timestamp    time.Time `json:"timestamp"`
	UserID       string    `json:"user_id"`
	ModelID      string    `json:"model_id"`
	InputTokens  int64     `json:"input_tokens"`
	OutputTokens int64     `json:"output_tokens"`
	// The parts of the totals the caller reported, shown only when it did.
	TokenParts
	Overage        Overage       `json:"overage"`
	BillingStatus  BillingStatus `json:"billing_status"`
	BilledAt       *time.Time    `json:"billed_at"`
	CreatedAt      time.Time     `json:"created_at"`
	FirstAttemptAt *time.Time    `json:"first_attempt_at,omitempty"`
	BillingMessage *string       `json:"billing_message,omitempty"`
	StripeEvents   []StripeEvent `json:"stripe_meter_events,omitempty"`
	// Meters is one line per meter the log feeds: the two default meters
	// first, then any other (see Catalog.Route).
	Meters []MeterLine `json:"meters,omitempty"`
	// Kind is KindUsage, or KindCorrection for a log that corrects
	// another (Corrects) by the token difference it holds.
	Kind     Kind       `json:"kind"`
	Corrects *uuid.UUID `json:"corrects,omitempty"`
	Reason   *string    `json:"reason,omitempty"`
	// CorrectedBy is who made a correction: the id of the tenant's API
	// key, or "admin" (ADMIN_TOKEN, the CLI). Shown on corrections only.
	CorrectedBy *string `json:"corrected_by,omitempty"`
	// StripeTimestamp is which time its meter events carry: "usage" (its
	// usage timestamp) or "reported" (the time its report was formed; its
	// period was closed then). Decided when its report is formed; before
	// that, and in ingest's answer, whether its period is closed now.
	StripeTimestamp string `json:"stripe_timestamp,omitempty"`
	// CorrectedTotals and Corrections are shown on a read of a usage log
	// (not a correction): its tokens plus its corrections', and those.
	CorrectedTotals *Overage   `json:"corrected_totals,omitempty"`
	Corrections     []UsageLog `json:"corrections,omitempty"`
}

// TokenParts are the optional parts of an event's totals: cached input
// read and written (part of input tokens) and reasoning (part of output
// tokens). Nil: not reported. Until meters route them, each part is billed
// with the total it belongs to.
type TokenParts struct {
	CacheRead  *int64 `json:"cache_read_input_tokens,omitempty"`
	CacheWrite *int64 `json:"cache_creation_input_tokens,omitempty"`
	Reasoning  *int64 `json:"reasoning_output_tokens,omitempty"`
}

// Input is the cached input tokens, read and written.
func (p TokenParts) Input() int64 {
	var n int64
	if p.CacheRead != nil {
		n += *p.CacheRead
	}
	if p.CacheWrite != nil {
		n += *p.CacheWrite
	}
	return n
}

// Kind is what a usage log records: usage, or a correction of another
// log.
type Kind string

const (
	KindUsage      Kind = "usage"
	KindCorrection Kind = "correction"
)

// Overage is the billable part of a usage log, per dimension.
type Overage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// Of returns the overage of one dimension.
func (o Overage) Of(d Dimension) int64 {
	if d == DimensionInput {
		return o.InputTokens
	}
	return o.OutputTokens
}

// Billable reports whether anything is to be sent to Stripe.
// A correction's overage may be negative: overage given back is sent too.
func (o Overage) Billable() bool { return o.InputTokens != 0 || o.OutputTokens != 0 }

// StripeEvent names the Stripe meter event that carries one dimension of a
// usage log: the identifier of its report, which may carry many logs (nil
// until the log joins a report), and this log's part of it.
type StripeEvent struct {
	Dimension  Dimension  `json:"dimension"`
	Identifier *string    `json:"identifier"`
	Value      int64      `json:"value"`
	AcceptedAt *time.Time `json:"accepted_at"`
}

// MeterEventKey is the Stripe Idempotency-Key and meter event identifier of
// the report of one dimension led by a usage log (a report of one log is
// exactly that log's event). It is derived from the lead log id alone, never
// from a job id, an attempt or a clock, so every retry, requeue and restart
// names the same business event and Stripe can deduplicate it.
func MeterEventKey(usageLogID uuid.UUID, d Dimension) string {
	return "usage-log:" + usageLogID.String() + ":" + string(d)
}
