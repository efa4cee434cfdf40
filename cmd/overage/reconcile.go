package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage/app"
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
	cfg, err := loadConfig(e, fs, args, "STRIPE_API_BASE", "LOG_LEVEL")
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
	if err := errors.Join(errs...); err != nil {
		return fs.usageError(err)
	}
	if cfg.StripeSecretKey == "" {
		return errors.New("STRIPE_SECRET_KEY is required to read Stripe's meter event summaries")
	}
	reader, err := stripeclient.NewSummaryReader(stripeclient.Config{
		SecretKey: cfg.StripeSecretKey, APIBase: cfg.StripeAPIBase, Logger: app.NewLogger(e.stderr, cfg.LogLevel),
	})
	if err != nil {
		return fmt.Errorf("STRIPE_SECRET_KEY/STRIPE_API_BASE: %w", err)
	}
	pool, err := app.OpenPool(ctx, cfg.DatabaseURL, app.ToolMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	rep, err := reconcile.Run(rctx, pool, reader, p)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	if *asJSON {
		if err := json.NewEncoder(e.stdout).Encode(rep); err != nil {
			return err
		}
	} else if err := reconcile.WriteText(e.stdout, rep); err != nil {
		return err
	}
	if msg := nothingJudged(rep); msg != "" {
		// On stderr with --json, so the JSON on stdout stays one object.
		w := e.stdout
		if *asJSON {
			w = e.stderr
		}
		fmt.Fprintln(w, msg)
	}
	if !rep.OK() {
		return fmt.Errorf("reconciliation found %d difference(s) between the database and Stripe", rep.Differences)
	}
	return nil
}

// nothingJudged says so when no window of the range could be compared yet:
// a clean exit must not pass for "everything matches".
func nothingJudged(rep *reconcile.Report) string {
	for _, r := range rep.Rows {
		if r.Status != reconcile.StatusTooRecent {
			return ""
		}
	}
	if len(rep.Rows) == 0 && rep.TooRecentFrom != rep.From {
		return "" // settled days with nothing billed and nothing in Stripe: they agree
	}
	msg := "nothing could be judged yet: every day in the range is too recent (newer than --settle-after, or still being billed)"
	if rep.TooRecentFrom != "" && rep.TooRecentFrom != rep.From {
		msg += "; days before " + rep.TooRecentFrom + " had nothing billed"
	}
	return msg + "; run it again later, or narrow --to to settled days"
}
