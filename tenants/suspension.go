package tenants

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/rivertype"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/usagelog"
)

// Suspension. A tenant whose Stripe customer was deleted is suspended (the
// customer.deleted webhook): ingest refuses its usage with 403
// tenant-suspended and its pending logs wait, unsent. Giving it a Stripe
// customer (tenant update --stripe-customer, PATCH stripe_customer_id)
// lifts the suspension, but only for a customer Stripe knows — asked with
// GET /v1/customers/{id} before anything changes — and queues its report
// job in the same transaction, so the logs that waited are billed at once
// rather than at the next sweep.

// CustomerChecker says whether Stripe knows a customer
// (stripeclient.Client implements it).
type CustomerChecker interface {
	CustomerExists(ctx context.Context, id string) (bool, error)
}

// ReportQueuer queues a tenant's report job in a transaction
// (outbox.Inserter implements it).
type ReportQueuer interface {
	InsertTenantReportTx(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID) (*rivertype.JobInsertResult, error)
}

// StripeRetryAfter is the Retry-After of a 503 stripe-unavailable.
const StripeRetryAfter = 30 * time.Second

// WithStripe returns a copy of s that lifts suspensions: customers checks
// the new customer, reports queues the tenant's report job. Without it an
// update that would lift a suspension answers 503 stripe-unavailable and
// changes nothing.
func (s *Store) WithStripe(customers CustomerChecker, reports ReportQueuer) *Store {
	c := *s
	c.customers, c.reports = customers, reports
	return &c
}

// errNoStripe: this process was not given Stripe's credentials.
var errNoStripe = &overage.Error{Code: overage.EUNAVAILABLE, Type: "stripe-unavailable", RetryAfter: StripeRetryAfter,
	Message: "the tenant is suspended and lifting it needs Stripe to confirm the customer, but STRIPE_SECRET_KEY is not configured here; nothing was changed"}

// checkLift, for an update that gives a suspended tenant a Stripe customer,
// asks Stripe whether it knows the customer: it reports whether the update
// lifts the suspension, or why it may not.
func (s *Store) checkLift(ctx context.Context, id uuid.UUID, p UpdateParams) (bool, error) {
	if p.StripeCustomerID == nil {
		return false, nil
	}
	var suspended bool
	err := s.pool.QueryRow(ctx, `SELECT suspended_at IS NOT NULL FROM tenants WHERE id = $1`, id).Scan(&suspended)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, errTenantNotFound(id)
	}
	if err != nil {
		return false, fmt.Errorf("read tenant %s: %w", id, err)
	}
	if !suspended {
		return false, nil
	}
	if s.customers == nil {
		return false, errNoStripe
	}
	cus := *p.StripeCustomerID
	ok, err := s.customers.CustomerExists(ctx, cus)
	if err != nil {
		// Unknown, not "no": the operator retries once Stripe answers.
		return false, fmt.Errorf("%w: %w", &overage.Error{Code: overage.EUNAVAILABLE, Type: "stripe-unavailable", RetryAfter: StripeRetryAfter,
			Message: fmt.Sprintf("Stripe could not be asked whether it knows customer %s, so the suspension stays; nothing was changed, retry later", cus)}, err)
	}
	if !ok {
		return false, overage.Invalid([]overage.FieldError{{Field: "stripe_customer_id",
			Detail: fmt.Sprintf("Stripe has no customer %s (or it was deleted): the suspension stays", cus)}},
			"the tenant is suspended: give it a Stripe customer Stripe knows")
	}
	return true, nil
}

// liftTx clears the suspension of tenant id in tx, parks the reports
// already sent to the deleted customer (usagelog.ParkOpenTx) and queues
// its report job when logs wait.
func (s *Store) liftTx(ctx context.Context, tx pgx.Tx, id uuid.UUID, oldCustomer string) error {
	if _, err := tx.Exec(ctx, `UPDATE tenants SET suspended_at = NULL, suspended_reason = NULL WHERE id = $1`, id); err != nil {
		return fmt.Errorf("lift the suspension of tenant %s: %w", id, err)
	}
	if _, err := usagelog.ParkOpenTx(ctx, tx, id, fmt.Sprintf(
		"sent to Stripe customer %s, deleted before Stripe's acceptance was recorded; resending to the tenant's new customer could bill twice or not at all: an operator must decide", oldCustomer)); err != nil {
		return err
	}
	waiting, err := usagelog.HasPending(ctx, tx, id)
	if err != nil {
		return err
	}
	if !waiting || s.reports == nil {
		// Nothing waits, or no queue here: the sweep queues the job after
		// SWEEP_GRACE.
		return nil
	}
	if _, err := s.reports.InsertTenantReportTx(ctx, tx, id); err != nil {
		return fmt.Errorf("queue the report job of tenant %s: %w", id, err)
	}
	return nil
}
