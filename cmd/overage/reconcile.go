package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/meters"
	"github.com/overage-billing/overage/reconcile"
	"github.com/overage-billing/overage/stripeclient"
)

const reconcileSynopsis = "overage reconcile --from YYYY-MM-DD --to YYYY-MM-DD [--tenant ID] [--json] [--settle-after 2h]"

// Exit statuses of reconcile, for a cron job to tell them apart.
const (
	reconcileDifference = 1 // the database and Stripe disagree
	// reconcileNoVerdict: nothing could be judged yet, or the database or
	// Stripe could not be read. (2 is a usage or configuration error.)
	reconcileNoVerdict = 3
)

// cmdReconcile compares, per customer, meter and UTC day, the overage the
// database holds as billed with Stripe's meter event summaries. It exits
// 0 when everything judged matches, 1 on a difference, 2 on a usage or
// configuration error, 3 when it could not judge.
func cmdReconcile(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "reconcile", reconcileSynopsis+`

Days are UTC and both inclusive. Windows newer than --settle-after are reported as too recent to judge; today is always too recent.
Exit status: 0 everything judged matches, 1 a difference, 2 a usage or configuration error, 3 nothing could be judged yet or the database or Stripe could not be read.`)
	from := fs.String("from", "", "first day, YYYY-MM-DD (UTC), required")
	to := fs.String("to", "", "last day, YYYY-MM-DD (UTC, inclusive), required")
	tenant := fs.String("tenant", "", "limit to one tenant's Stripe customer")
	asJSON := fs.Bool("json", false, "print one JSON object")
	settle := fs.Duration("settle-after", reconcile.DefaultSettleAfter, "how long Stripe's summaries and our retries need to settle (0s judges every day that has ended)")
	var cfg struct {
		db     app.DBConfig
		stripe app.StripeConfig
		meters app.MeterConfig
		log    app.LogConfig
	}
	err := loadConfig(e, fs, args, &cfg.db, &cfg.stripe, &cfg.meters, &cfg.log)
	var ue *usageError
	if err != nil && !errors.As(err, &ue) {
		return &exitError{code: 2, err: err} // a malformed variable
	}
	if err != nil {
		return err
	}
	p := reconcile.Params{MeterInputEvent: cfg.meters.InputEvent, MeterOutputEvent: cfg.meters.OutputEvent, SettleAfter: *settle}
	var errs []error
	if *from == "" {
		errs = append(errs, errors.New("--from is required"))
	} else if p.From, err = reconcile.ParseDay(*from); err != nil {
		errs = append(errs, fmt.Errorf("--from: %w", err))
	}
	if *to == "" {
		errs = append(errs, errors.New("--to is required"))
	} else if p.To, err = reconcile.ParseDay(*to); err != nil {
		errs = append(errs, fmt.Errorf("--to: %w", err))
	}
	if !p.From.IsZero() && !p.To.IsZero() && p.From.After(p.To) {
		errs = append(errs, fmt.Errorf("--from %s is after --to %s", *from, *to))
	}
	if *settle < 0 {
		errs = append(errs, fmt.Errorf("--settle-after %s must not be negative", *settle))
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
	if cfg.meters.InputEvent == cfg.meters.OutputEvent {
		return &exitError{code: 2, err: fmt.Errorf("STRIPE_METER_INPUT_EVENT and STRIPE_METER_OUTPUT_EVENT are both %q", cfg.meters.InputEvent)}
	}
	if cfg.stripe.SecretKey == "" {
		return &exitError{code: 2, err: errors.New("STRIPE_SECRET_KEY is required to read Stripe's meter event summaries (sk_test_... with STRIPE_API_BASE pointing at an emulator or stripe-mock to try it out)")}
	}
	// stripe-go's own log lines (a WARN per failed request) would come
	// before the one error line that says what failed: only at debug.
	stripeLog := slog.New(slog.DiscardHandler)
	if cfg.log.Level < slog.LevelInfo {
		stripeLog = app.NewLogger(e.stderr, cfg.log.Level)
	}
	reader, err := stripeclient.NewSummaryReader(stripeclient.Config{
		SecretKey: cfg.stripe.SecretKey, APIBase: cfg.stripe.APIBase, Logger: stripeLog,
	})
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("STRIPE_SECRET_KEY/STRIPE_API_BASE: %w", err)}
	}
	pool, err := app.OpenPool(ctx, cfg.db.URL, app.ToolMaxConns)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	defer pool.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	if p.Meters, err = meters.NewStore(pool, cfg.meters.InputEvent, cfg.meters.OutputEvent).List(ctx); err != nil {
		return &exitError{code: 3, err: fmt.Errorf("read the meter catalog: %w", err)}
	}
	res, err := reconcile.Run(rctx, pool, reader, p)
	if err != nil {
		var appErr *overage.Error
		if errors.As(err, &appErr) && appErr.Code == overage.ENOTFOUND {
			return fs.usageError(err) // --tenant names no tenant
		}
		// Run's errors say "reconcile: ..." already.
		return &exitError{code: reconcileNoVerdict, err: err}
	}
	if *asJSON {
		if err := json.NewEncoder(e.stdout).Encode(res); err != nil {
			return err
		}
	} else if err := reconcile.WriteText(e.stdout, res); err != nil {
		return err
	}
	if !res.OK() {
		return &exitError{code: reconcileDifference, err: fmt.Errorf("reconciliation found %d difference(s) between the database and Stripe", res.Differences)}
	}
	if msg := nothingJudged(res); msg != "" {
		// A clean exit must not pass for "everything matches".
		return &exitError{code: reconcileNoVerdict, err: errors.New(msg)}
	}
	return nil
}

// nothingJudged says so when no window of the range could be compared yet.
func nothingJudged(res *reconcile.Result) string {
	if res.Judged() {
		return ""
	}
	msg := "nothing could be judged yet: every day in the range is too recent (newer than --settle-after, or still being billed; today always is)"
	if res.TooRecentFrom != "" && res.TooRecentFrom != res.From {
		msg += "; days before " + res.TooRecentFrom + " had nothing billed"
	}
	return msg + "; run it again later, or narrow --to to settled days"
}
