package app

import (
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/tenants"
)

// NewTenants is the tenant store of `overage serve` and `overage tenant`:
// giving a suspended tenant a Stripe customer lifts the suspension once
// Stripe (STRIPE_SECRET_KEY, STRIPE_API_BASE) confirms the customer, and
// queues the tenant's report job through rc. Without STRIPE_SECRET_KEY
// every other change works and a lift answers 503 stripe-unavailable.
func NewTenants(pool *pgxpool.Pool, rc *river.Client[pgx.Tx], stripe StripeConfig, report ReportConfig, logger *slog.Logger) (*tenants.Store, error) {
	store := tenants.NewStore(pool)
	if stripe.SecretKey == "" {
		return store.WithStripe(nil, NewInserter(rc, report)), nil
	}
	sc, err := stripeclient.New(stripeclient.Config{SecretKey: stripe.SecretKey, APIBase: stripe.APIBase, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("STRIPE_SECRET_KEY/STRIPE_API_BASE: %w", err)
	}
	return store.WithStripe(sc, NewInserter(rc, report)), nil
}
