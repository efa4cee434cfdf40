package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/tenants"
)

const (
	tenantCreateSynopsis = "overage tenant create --name NAME --stripe-customer CUS [--included KEY=N]… [--included-input-tokens N] [--included-output-tokens N]"
	tenantListSynopsis   = "overage tenant list [--json]"
	tenantShowSynopsis   = "overage tenant show ID [--json]"
	tenantUpdateSynopsis = "overage tenant update ID [--name N] [--stripe-customer CUS] [--included KEY=N]… [--included-input-tokens N] [--included-output-tokens N] [--alert-url URL] [--alert-at P,P…]"
	tenantKeySynopsis    = "overage tenant key create ID | overage tenant key revoke ID KEY_ID"
)

var tenantUsage = "Usage:\n  " + strings.Join([]string{tenantCreateSynopsis, tenantListSynopsis, tenantShowSynopsis, tenantUpdateSynopsis,
	"overage tenant key create ID", "overage tenant key revoke ID KEY_ID"}, "\n  ") + `

A new API key is printed once, in the JSON of "create" and "key create", and
stored only as its SHA-256. A tenant may hold several keys: create the new
one, deploy it, then revoke the old one; a revoked key's next request is
refused. An allowance change applies to usage recorded after it.
"update --stripe-customer" lifts a suspended tenant's suspension (its Stripe
customer was deleted) once Stripe, asked with STRIPE_SECRET_KEY, knows the
new customer; the tenant's pending usage logs are then billed.

Allowances are per meter (see "overage meter --help"): --included KEY=N,
repeated, gives meter KEY N tokens per billing period before overage;
--included-input-tokens N and --included-output-tokens N are --included
input=N and --included output=N. On update only the meters named change;
--included KEY=0 removes a meter's allowance.
`

// cmdTenant manages tenants and their API keys; `/v1/tenants` does the
// same over HTTP with the same JSON.
func cmdTenant(ctx context.Context, e env, args []string) error {
	if len(args) == 0 {
		return &usageError{err: errors.New("missing tenant command"), command: "tenant", synopsis: "overage tenant create|list|show|update|key ..."}
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(e.stdout, tenantUsage)
		return nil
	case "create":
		return cmdTenantCreate(ctx, e, args[1:])
	case "list":
		return cmdTenantList(ctx, e, args[1:])
	case "show":
		return cmdTenantShow(ctx, e, args[1:])
	case "update":
		return cmdTenantUpdate(ctx, e, args[1:])
	case "key":
		return cmdTenantKey(ctx, e, args[1:])
	}
	return &usageError{err: fmt.Errorf("unknown tenant command %q", args[0]), command: "tenant", synopsis: "overage tenant create|list|show|update|key ..."}
}

// withTenants opens a small pool for one tenant command.
func withTenants(ctx context.Context, db app.DBConfig, f func(*tenants.Store) error) error {
	pool, err := app.OpenPool(ctx, db.URL, app.ToolMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	return f(tenants.NewStore(pool))
}

func printJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func cmdTenantCreate(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "tenant create", tenantCreateSynopsis)
	var p tenants.CreateParams
	fs.StringVar(&p.Name, "name", "", "tenant name (required)")
	fs.StringVar(&p.StripeCustomerID, "stripe-customer", "", "Stripe customer id, cus_... (required)")
	inc := includedFlags(fs)
	var db app.DBConfig
	if err := loadConfig(e, fs, args, &db); err != nil {
		return err
	}
	if err := fs.require("name", "stripe-customer"); err != nil {
		return err
	}
	included, err := inc()
	if err != nil {
		return err
	}
	p.Included = included
	if err := p.Validate(); err != nil {
		return err
	}
	return withTenants(ctx, db, func(s *tenants.Store) error {
		created, err := s.Create(ctx, p)
		if err != nil {
			return fmt.Errorf("create tenant: %w", err)
		}
		return printJSON(e.stdout, created)
	})
}

func cmdTenantList(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "tenant list", tenantListSynopsis)
	asJSON := fs.Bool("json", false, "print the JSON of GET /v1/tenants")
	var db app.DBConfig
	if err := loadConfig(e, fs, args, &db); err != nil {
		return err
	}
	return withTenants(ctx, db, func(s *tenants.Store) error {
		l, err := s.List(ctx)
		if err != nil {
			return fmt.Errorf("list tenants: %w", err)
		}
		if *asJSON {
			return printJSON(e.stdout, l)
		}
		if len(l.Tenants) == 0 {
			fmt.Fprintln(e.stdout, `no tenants yet: add one with "overage tenant create"`)
			return nil
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tSTRIPE CUSTOMER\tINCLUDED INPUT\tINCLUDED OUTPUT\tINCLUDED, OTHER METERS\tACTIVE KEYS\tSUSPENDED")
		for _, t := range l.Tenants {
			other := otherIncluded(t.Included)
			if other == "" {
				other = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%d\t%s\n", t.ID, t.Name, t.StripeCustomerID,
				t.IncludedInputTokens, t.IncludedOutputTokens, other, activeKeys(t.APIKeys), yesNo(t.SuspendedAt != nil))
		}
		return tw.Flush()
	})
}

func activeKeys(keys []tenants.APIKey) int {
	n := 0
	for _, k := range keys {
		if k.RevokedAt == nil {
			n++
		}
	}
	return n
}

var idNames = map[string]string{"ID": "a tenant id", "KEY_ID": "an API key id", "USAGE_LOG_ID": "a usage log id"}

// leadingIDs takes the ids that come before a command's flags.
func leadingIDs(fs *flags, args []string, names ...string) ([]uuid.UUID, []string, error) {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
		return nil, nil, fs.parse(args[:1])
	}
	ids := make([]uuid.UUID, len(names))
	for i, name := range names {
		if i >= len(args) || strings.HasPrefix(args[i], "-") {
			return nil, nil, fs.usageError(fmt.Errorf("missing %s", name))
		}
		id, err := uuid.Parse(args[i])
		if err != nil {
			return nil, nil, fs.usageError(fmt.Errorf("%q is not %s", args[i], idNames[name]))
		}
		ids[i] = id
	}
	return ids, args[len(names):], nil
}

func cmdTenantShow(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "tenant show", tenantShowSynopsis)
	asJSON := fs.Bool("json", false, "print the JSON of GET /v1/tenants/{id}")
	ids, rest, err := leadingIDs(fs, args, "ID")
	if err != nil {
		return err
	}
	var db app.DBConfig
	if err := loadConfig(e, fs, rest, &db); err != nil {
		return err
	}
	return withTenants(ctx, db, func(s *tenants.Store) error {
		d, err := s.Show(ctx, ids[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, d)
		}
		return writeTenant(e.stdout, d)
	})
}

// writeTenant prints a tenant for a person: never a key, only its id and
// first characters.
func writeTenant(w io.Writer, d *tenants.Details) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%s\n", d.ID)
	fmt.Fprintf(tw, "name\t%s\n", d.Name)
	fmt.Fprintf(tw, "stripe customer\t%s\n", d.StripeCustomerID)
	other := otherIncluded(d.Included)
	if other != "" {
		other = ", " + strings.ReplaceAll(other, ",", ", ")
	}
	fmt.Fprintf(tw, "included tokens\t%d input, %d output%s per period\n", d.IncludedInputTokens, d.IncludedOutputTokens, other)
	fmt.Fprintf(tw, "created\t%s\n", d.CreatedAt.UTC().Format(time.RFC3339))
	if s := d.Subscription; s != nil {
		fmt.Fprintf(tw, "subscription\t%s (%s), period %s to %s\n", s.ID, s.Status,
			s.CurrentPeriodStart.UTC().Format(time.RFC3339), s.CurrentPeriodEnd.UTC().Format(time.RFC3339))
	} else {
		fmt.Fprintf(tw, "subscription\tnone known: the allowance period is the calendar month (UTC)\n")
	}
	if d.SuspendedAt != nil {
		reason := ""
		if d.SuspendedReason != nil {
			reason = ": " + *d.SuspendedReason
		}
		fmt.Fprintf(tw, "suspended\tsince %s%s\n", d.SuspendedAt.UTC().Format(time.RFC3339), reason)
	} else {
		fmt.Fprintf(tw, "suspended\tno\n")
	}
	alertURL := "none"
	if d.AlertURL != nil {
		alertURL = *d.AlertURL
	}
	at := make([]string, len(d.AlertAt))
	for i, p := range d.AlertAt {
		at[i] = strconv.Itoa(p) + "%"
	}
	if len(at) == 0 {
		at = []string{"none"}
	}
	fmt.Fprintf(tw, "alerts	%s at %s of each meter's allowance\n", alertURL, strings.Join(at, ", "))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nAPI keys:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  KEY ID\tPREFIX\tCREATED\tREVOKED")
	for _, k := range d.APIKeys {
		revoked := "-"
		if k.RevokedAt != nil {
			revoked = k.RevokedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "  %s\t%s…\t%s\t%s\n", k.ID, k.Prefix, k.CreatedAt.UTC().Format(time.RFC3339), revoked)
	}
	return tw.Flush()
}

func cmdTenantUpdate(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "tenant update", tenantUpdateSynopsis+"\n\nAn allowance change applies to usage recorded after it; nothing already recorded is recomputed.\n"+
		"For a suspended tenant (its Stripe customer was deleted), --stripe-customer lifts the suspension once Stripe\n"+
		"(STRIPE_SECRET_KEY, STRIPE_API_BASE) confirms it knows the customer; its pending usage logs are then billed.\n"+
		"Setting --alert-url prints the endpoint's signing secret (whsec_...) once, as alert_secret; --alert-url \"\" and --alert-at \"\" remove them.")
	name := fs.String("name", "", "new tenant name")
	customer := fs.String("stripe-customer", "", "new Stripe customer id, cus_...")
	inc := includedFlags(fs)
	alertURL := fs.String("alert-url", "", "where threshold events are POSTed (http or https); \"\" removes it")
	alertAt := fs.String("alert-at", "", "thresholds, percentages of each meter's allowance (e.g. 80,100); \"\" removes them")
	ids, rest, err := leadingIDs(fs, args, "ID")
	if err != nil {
		return err
	}
	// Lifting a suspension asks Stripe and queues the tenant's report
	// job as serve would.
	var cfg struct {
		db     app.DBConfig
		stripe app.StripeConfig
		report app.ReportConfig
	}
	if err := loadConfig(e, fs, rest, &cfg.db, &cfg.stripe, &cfg.report); err != nil {
		return err
	}
	// Only the flags given change anything: --name "" is an error, not
	// "leave it".
	var p tenants.UpdateParams
	var errs []error
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "name":
			p.Name = name
		case "stripe-customer":
			p.StripeCustomerID = customer
		case "alert-url":
			p.AlertURL = alertURL
		case "alert-at":
			at := []int{}
			for _, v := range strings.Split(*alertAt, ",") {
				if v = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "%")); v == "" {
					continue
				}
				n, err := strconv.Atoi(v)
				if err != nil {
					errs = append(errs, fmt.Errorf("--alert-at %q: want whole percentages, comma-separated (80,100)", *alertAt))
					return
				}
				at = append(at, n)
			}
			p.AlertAt = &at
		}
	})
	if err := errors.Join(errs...); err != nil {
		return fs.usageError(err)
	}
	if p.Included, err = inc(); err != nil {
		return err
	}
	if p.Empty() {
		return fs.usageError(errors.New("nothing to change: give --name, --stripe-customer, --included KEY=N, --included-input-tokens, --included-output-tokens, --alert-url or --alert-at"))
	}
	if err := p.Validate(); err != nil {
		return err
	}
	tool, err := openTool(ctx, e, "tenant update", cfg.db, cfg.report)
	if err != nil {
		return err
	}
	defer tool.Close()
	// A new customer for a suspended tenant is checked with Stripe and
	// lifts the suspension, queueing the tenant's report job.
	s, err := app.NewTenants(tool.Pool, tool.River, cfg.stripe, cfg.report, nil)
	if err != nil {
		return err
	}
	d, err := s.Update(ctx, ids[0], p)
	if err != nil {
		return fmt.Errorf("update tenant: %w", err)
	}
	return printJSON(e.stdout, d)
}

func cmdTenantKey(ctx context.Context, e env, args []string) error {
	if len(args) == 0 || (args[0] != "create" && args[0] != "revoke") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprint(e.stdout, tenantUsage)
			return nil
		}
		return &usageError{err: errors.New("want \"key create\" or \"key revoke\""), command: "tenant", synopsis: tenantKeySynopsis}
	}
	if args[0] == "create" {
		fs := newFlags(e, "tenant key create", "overage tenant key create ID\n\nPrints the new key once, in JSON; it is stored only as its SHA-256.")
		ids, rest, err := leadingIDs(fs, args[1:], "ID")
		if err != nil {
			return err
		}
		var db app.DBConfig
		if err := loadConfig(e, fs, rest, &db); err != nil {
			return err
		}
		return withTenants(ctx, db, func(s *tenants.Store) error {
			k, err := s.AddKey(ctx, ids[0])
			if err != nil {
				return fmt.Errorf("create API key: %w", err)
			}
			return printJSON(e.stdout, k)
		})
	}
	fs := newFlags(e, "tenant key revoke", "overage tenant key revoke ID KEY_ID\n\nThe key's next request is refused with 401.")
	ids, rest, err := leadingIDs(fs, args[1:], "ID", "KEY_ID")
	if err != nil {
		return err
	}
	var db app.DBConfig
	if err := loadConfig(e, fs, rest, &db); err != nil {
		return err
	}
	return withTenants(ctx, db, func(s *tenants.Store) error {
		k, err := s.RevokeKeyByID(ctx, ids[0], ids[1])
		if err != nil {
			return fmt.Errorf("revoke API key: %w", err)
		}
		return printJSON(e.stdout, k)
	})
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

// includedFlags adds --included KEY=N (repeatable) and its two aliases,
// --included-input-tokens N and --included-output-tokens N, to fs. The
// function it returns, called after parsing, gives the allowances named
// (nil when none): a key named twice with two numbers is a usage error.
func includedFlags(fs *flags) func() (map[string]int64, error) {
	var m map[string]int64
	var errs []error
	set := func(flagName, key, v string) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s %q: want a whole number of tokens", flagName, v))
			return
		}
		if m == nil {
			m = map[string]int64{}
		}
		if old, ok := m[key]; ok && old != n {
			errs = append(errs, fmt.Errorf("meter %s's allowance is given twice, as %d and %d", key, old, n))
			return
		}
		m[key] = n
	}
	fs.Func("included", "include `KEY=N`: N tokens of meter KEY per billing period before overage (repeatable)", func(v string) error {
		key, n, ok := strings.Cut(v, "=")
		if !ok || key == "" {
			errs = append(errs, fmt.Errorf("--included %q: want KEY=N, e.g. --included gpt4o_input=100000", v))
			return nil
		}
		set("included", key, n)
		return nil
	})
	fs.Func("included-input-tokens", "`N` input tokens included per billing period (--included input=N)", func(v string) error {
		set("included-input-tokens", "input", v)
		return nil
	})
	fs.Func("included-output-tokens", "`N` output tokens included per billing period (--included output=N)", func(v string) error {
		set("included-output-tokens", "output", v)
		return nil
	})
	return func() (map[string]int64, error) {
		if err := errors.Join(errs...); err != nil {
			return nil, fs.usageError(err)
		}
		return m, nil
	}
}

// otherIncluded lists the allowances of the meters other than the
// defaults, by key: "cache_reads=5000,gpt4o_input=100000" ("" for none).
func otherIncluded(included map[string]int64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(included)) {
		if !overage.IsDefaultMeter(k) {
			parts = append(parts, fmt.Sprintf("%s=%d", k, included[k]))
		}
	}
	return strings.Join(parts, ",")
}
