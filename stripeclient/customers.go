package stripeclient

import (
	"context"
	"errors"
	"fmt"

	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/customer"
)

// CustomerChecker says whether Stripe knows a customer. *Client implements
// it; lifting a tenant's suspension asks it.
type CustomerChecker interface {
	CustomerExists(ctx context.Context, id string) (bool, error)
}

var _ CustomerChecker = (*Client)(nil)

// CustomerExists asks Stripe for the customer (GET /v1/customers/{id}).
// It is false for one Stripe does not have (404 resource_missing) and for
// a deleted one (Stripe answers it with "deleted": true): no meter event
// for either could be billed. Any other outcome — no answer, a 5xx, a 429,
// a refused API key — is an error: whether the customer exists is then
// unknown.
func (c *Client) CustomerExists(ctx context.Context, id string) (bool, error) {
	if id == "" {
		return false, nil
	}
	params := &stripe.CustomerParams{}
	params.Context = ctx
	cus, err := c.customers.Get(id, params)
	var se *stripe.Error
	switch {
	case errors.As(err, &se) && se.HTTPStatusCode == 404:
		return false, nil
	case err != nil:
		return false, fmt.Errorf("stripe: look up customer %s: %w", id, err)
	}
	return !cus.Deleted, nil
}

// customerClient is the part of stripe-go's customer.Client used here.
type customerClient = customer.Client
