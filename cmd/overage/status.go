package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/finance"
	"github.com/overage-billing/overage/review"
)

const statusSynopsis = "overage status [--tenant ID] [--json]"

// cmdStatus prints the finance statement: billed status per tenant and in total,
// then the logs an operator must decide on.
func cmdStatus(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "status", statusSynopsis)
	tenant := fs.String("tenant", "", "only this tenant")
	asJSON := fs.Bool("json", false, "print the JSON object of GET /v1/billing/status")
	var db app.DBConfig
	if err := loadConfig(e, fs, args, &db); err != nil {
		return err
	}
	tenantID, err := optionalUUID("--tenant", *tenant)
	if err != nil {
		return err
	}
	pool, err := app.OpenPool(ctx, db.URL, app.ToolMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	rep, err := finance.Status(ctx, pool, tenantID)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(rep)
	}
	if err := finance.WriteTable(e.stdout, rep); err != nil {
		return err
	}
	// Past Stripe's window nothing is resent automatically: show what waits
	// for an operator.
	parked, err := review.List(ctx, pool, review.ListParams{TenantID: tenantID, Statuses: []overage.BillingStatus{overage.BillingStatusNeedsReview}, Limit: 20})
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if len(parked) > 0 {
		fmt.Fprintln(e.stdout)
		if err := review.WriteTable(e.stdout, parked); err != nil {
			return err
		}
	}
	// Meter events Stripe itself could not apply, from its webhooks.
	merrs, err := finance.MeterErrors(ctx, pool, 10)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if len(merrs) > 0 {
		fmt.Fprintln(e.stdout)
		return finance.WriteMeterErrors(e.stdout, merrs)
	}
	return nil
}
