package tenants

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
)

// What Stripe's webhooks tell about a tenant's customer — its
// subscription periods, the periods its invoices closed, its deletion —
// applied in the webhook processor's transaction (db is that
// transaction), to every tenant of the customer.

// SubscriptionChange is a subscription as a Stripe event tells it.
type SubscriptionChange struct {
	Customer, ID, Status string
	// Start and End bound its current period: the allowance period.
	Start, End time.Time
	// EventCreated orders the events: an older one never overwrites a
	// newer one's period.
	EventCreated time.Time
}

// ApplySubscription records s for every tenant of its customer unless a
// newer event already did, and returns how many tenants it changed.
func ApplySubscription(ctx context.Context, db overage.DB, s SubscriptionChange) (int64, error) {
	tag, err := db.Exec(ctx, `INSERT INTO tenant_subscriptions AS s
			(tenant_id, stripe_subscription_id, status, current_period_start, current_period_end, event_created)
		SELECT t.id, $2, $3, $4, $5, $6 FROM tenants t WHERE t.stripe_customer_id = $1
		ON CONFLICT (tenant_id, stripe_subscription_id) DO UPDATE SET
			status = EXCLUDED.status, current_period_start = EXCLUDED.current_period_start,
			current_period_end = EXCLUDED.current_period_end, event_created = EXCLUDED.event_created, updated_at = now()
		WHERE s.event_created <= EXCLUDED.event_created`,
		s.Customer, s.ID, s.Status, s.Start, s.End, s.EventCreated)
	if err != nil {
		return 0, fmt.Errorf("apply subscription %s of %s: %w", s.ID, s.Customer, err)
	}
	return tag.RowsAffected(), nil
}

// ClosePeriods records that invoice closed the allowance periods of every
// tenant of customer that began before end (closed_periods, read by
// usagelog.PeriodClosedSQL), and returns how many tenants it closed
// periods of; 0 when the invoice was recorded already or no tenant has
// the customer.
func ClosePeriods(ctx context.Context, db overage.DB, customer, invoice string, start, end, eventCreated time.Time) (int64, error) {
	tag, err := db.Exec(ctx, `INSERT INTO closed_periods (tenant_id, stripe_invoice_id, period_start, period_end, event_created)
		SELECT t.id, $2, $3, $4, $5 FROM tenants t WHERE t.stripe_customer_id = $1
		ON CONFLICT (tenant_id, stripe_invoice_id) DO NOTHING`, customer, invoice, start, end, eventCreated)
	if err != nil {
		return 0, fmt.Errorf("close the period of invoice %s of %s: %w", invoice, customer, err)
	}
	return tag.RowsAffected(), nil
}

// SuspendCustomer suspends every tenant of customer (its Stripe customer
// was deleted) with reason, as of at unless already suspended, and
// returns how many tenants have the customer.
func SuspendCustomer(ctx context.Context, db overage.DB, customer string, at time.Time, reason string) (int64, error) {
	tag, err := db.Exec(ctx, `UPDATE tenants SET suspended_at = coalesce(suspended_at, $2), suspended_reason = $3
		WHERE stripe_customer_id = $1`, customer, at, reason)
	if err != nil {
		return 0, fmt.Errorf("suspend tenant of %s: %w", customer, err)
	}
	return tag.RowsAffected(), nil
}

// CountOfCustomer is how many tenants have the Stripe customer.
func CountOfCustomer(ctx context.Context, db overage.DB, customer string) (int, error) {
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM tenants WHERE stripe_customer_id = $1`, customer).Scan(&n); err != nil {
		return 0, fmt.Errorf("find tenant of %s: %w", customer, err)
	}
	return n, nil
}

// Billing is what the report job needs of a tenant: its Stripe customer
// and whether it is suspended.
type Billing struct {
	StripeCustomerID string
	Suspended        bool
}

// ReadBilling reads the tenant's Stripe customer and suspension.
func ReadBilling(ctx context.Context, db overage.DB, id uuid.UUID) (Billing, error) {
	var b Billing
	if err := db.QueryRow(ctx, `SELECT stripe_customer_id, suspended_at IS NOT NULL FROM tenants WHERE id = $1`, id).
		Scan(&b.StripeCustomerID, &b.Suspended); err != nil {
		return b, fmt.Errorf("read tenant %s: %w", id, err)
	}
	return b, nil
}

// CustomerTenant is a tenant as reconciliation groups them: by Stripe
// customer.
type CustomerTenant struct {
	ID               uuid.UUID
	Name             string
	StripeCustomerID string
}

// ByCustomer lists the tenants ordered by Stripe customer, then id: every
// tenant, or, with sharing set, those with the Stripe customer of tenant
// *sharing (none when it does not exist).
func ByCustomer(ctx context.Context, db overage.DB, sharing *uuid.UUID) ([]CustomerTenant, error) {
	q := `SELECT id, name, stripe_customer_id FROM tenants ORDER BY stripe_customer_id, id`
	var args []any
	if sharing != nil {
		q = `SELECT id, name, stripe_customer_id FROM tenants
			WHERE stripe_customer_id = (SELECT stripe_customer_id FROM tenants WHERE id = $1)
			ORDER BY stripe_customer_id, id`
		args = append(args, *sharing)
	}
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("read tenants: %w", err)
	}
	ts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (CustomerTenant, error) {
		var t CustomerTenant
		err := row.Scan(&t.ID, &t.Name, &t.StripeCustomerID)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("read tenants: %w", err)
	}
	return ts, nil
}
