package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage/reconcile"
	"github.com/overage-billing/overage/stripeclient"
)

const reconcileSynopsis = "overage reconcile --from YYYY-MM-DD --to YYYY-MM-DD [--tenant ID] [--json] [--settle-after 2h]"

// cmdReconcile compares, per customer, meter and UTC day, the overage the
// database holds as billed with Stripe's meter event summaries. It exits 1
// when anything differs.
func cmdReconcile(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "reconcile", reconcileSynopsis+"\n\nDays are UTC and both inclusive. Windows newer than --settle-after are reported as too recent to judge; exit status 1 means a difference")
	from := fs.String("from", "", "first day, YYYY-MM-DD (UTC), required")
	to := fs.String("to", "", "last day, YYYY-MM-DD (UTC, inclusive), required")
	tenant := fs.String("tenant", "", "limit to one tenant's Stripe customer")
	asJSON := fs.Bool("json", false, "print one JSON object")
	settle := fs.Duration("settle-after", reconcile.DefaultSettleAfter, "how long Stripe's summaries and our retries need to settle")
	cfg, err := loadConfig(e, fs, args)
	if err != nil {
		return err
	}
	p := reconcile.Params{MeterInputEvent: cfg.MeterInputEvent, MeterOutputEvent: cfg.MeterOutputEvent, SettleAfter: *settle}
	var errs []error
	if p.From, err = reconcile.ParseDay(*from); err != nil {
		errs = append(errs, fmt.Errorf("--from: %w", err))
	}
	if p.To, err = reconcile.ParseDay(*to); err != nil {
		errs = append(errs, fmt.Errorf("--to: %w", err))
	}
	if *tenant != "" {
		id, err := uuid.Parse(*tenant)
		if err != nil {
			errs = append(errs, fmt.Errorf("--tenant %q: not a tenant id", *tenant))
		}
		p.TenantID = &id
	}
	if cfg.StripeSecretKey == "" {
		errs = append(errs, errors.New("STRIPE_SECRET_KEY is required to read Stripe's meter event summaries"))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	reader, err := stripeclient.NewSummaryReader(stripeclient.Config{
		SecretKey: cfg.StripeSecretKey, APIBase: cfg.StripeAPIBase, Logger: newLogger(e.stderr, cfg.LogLevel),
	})
	if err != nil {
		return fmt.Errorf("STRIPE_SECRET_KEY/STRIPE_API_BASE: %w", err)
	}
	pool, err := openPool(ctx, cfg.DatabaseURL, toolMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	rep, err := reconcile.Run(rctx, pool, reader, p)
	if err != nil {
		return fmt.Errorf("reconcile: %w", describeError(err))
	}
	if *asJSON {
		if err := json.NewEncoder(e.stdout).Encode(rep); err != nil {
			return err
		}
	} else if err := reconcile.WriteText(e.stdout, rep); err != nil {
		return err
	}
	if !rep.OK() {
		return fmt.Errorf("reconciliation found %d difference(s) between the database and Stripe", rep.Differences)
	}
	return nil
}
