package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/tenants"
)

func cmdTenant(ctx context.Context, e env, args []string) error {
	if len(args) == 0 || args[0] != "create" {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
			fmt.Fprintln(e.stdout, "Usage: overage tenant create --name NAME --stripe-customer CUS [--included-input-tokens N] [--included-output-tokens N]")
			return nil
		}
		return errors.New(`usage: overage tenant create --name NAME --stripe-customer CUS (see "overage tenant create --help")`)
	}
	fs := newFlags(e, "tenant create", "overage tenant create --name NAME --stripe-customer CUS [--included-input-tokens N] [--included-output-tokens N]")
	var p tenants.CreateParams
	fs.StringVar(&p.Name, "name", "", "tenant name (required)")
	fs.StringVar(&p.StripeCustomerID, "stripe-customer", "", "Stripe customer id, cus_... (required)")
	fs.Int64Var(&p.IncludedInputTokens, "included-input-tokens", 0, "input tokens included per billing period")
	fs.Int64Var(&p.IncludedOutputTokens, "included-output-tokens", 0, "output tokens included per billing period")
	cfg, err := loadConfig(e, fs, args[1:])
	if err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return describeError(err)
	}
	pool, err := openPool(ctx, cfg.DatabaseURL, toolMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	created, err := tenants.NewStore(pool).Create(ctx, p)
	if err != nil {
		return fmt.Errorf("create tenant: %w", describeError(err))
	}
	b, err := json.Marshal(created)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, string(b))
	return nil
}

// describeError renders an application error with its fields on one line.
func describeError(err error) error {
	var appErr *overage.Error
	if !errors.As(err, &appErr) || len(appErr.Fields) == 0 {
		return err
	}
	msg := appErr.Message
	for _, f := range appErr.Fields {
		msg += fmt.Sprintf("; --%s %s", f.Field, f.Detail)
	}
	return errors.New(msg)
}
