package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/meters"
)

const (
	meterCreateSynopsis  = "overage meter create --key K --event-name E --token-type T [--models P,P…]"
	meterListSynopsis    = "overage meter list [--json]"
	meterArchiveSynopsis = "overage meter archive KEY"
)

var meterUsage = "Usage:\n  " + strings.Join([]string{meterCreateSynopsis, meterListSynopsis, meterArchiveSynopsis}, "\n  ") + `

A meter is one Stripe Billing Meter (its event name) and the tokens it
counts: one token type (input, cache_read, cache_write, output, reasoning)
of the models its patterns match (an exact model id, a prefix ending in *,
or * alone). Each kind of token goes to the active meter of its type whose
pattern matches the model most specifically; a kind with no such meter goes
where its parent goes (cache reads and writes where input goes, reasoning
where output goes). The default meters input and output always exist (their
event names are STRIPE_METER_INPUT_EVENT and STRIPE_METER_OUTPUT_EVENT) and
cannot be archived. A change applies to usage recorded after it.
`

// cmdMeter manages the meter catalog; `/v1/meters` does the same over
// HTTP with the same JSON.
func cmdMeter(ctx context.Context, e env, args []string) error {
	const synopsis = "overage meter create|list|archive ..."
	if len(args) == 0 {
		return &usageError{err: errors.New("missing meter command"), command: "meter", synopsis: synopsis}
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(e.stdout, meterUsage)
		return nil
	case "create":
		return cmdMeterCreate(ctx, e, args[1:])
	case "list":
		return cmdMeterList(ctx, e, args[1:])
	case "archive":
		return cmdMeterArchive(ctx, e, args[1:])
	}
	return &usageError{err: fmt.Errorf("unknown meter command %q", args[0]), command: "meter", synopsis: synopsis}
}

// withMeters opens a small pool for one meter command. The store names
// the default meters by this process's settings, as `serve` and `work`
// name them.
func withMeters(ctx context.Context, cfg *meterConfig, f func(*meters.Store) error) error {
	pool, err := app.OpenPool(ctx, cfg.db.URL, app.ToolMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	return f(meters.NewStore(pool, cfg.meters.InputEvent, cfg.meters.OutputEvent))
}

// meterConfig is what a meter command reads: the database and the
// default meters' event names.
type meterConfig struct {
	db     app.DBConfig
	meters app.MeterConfig
}

// load fills c through loadConfig.
func (c *meterConfig) load(e env, fs *flags, args []string) error {
	return loadConfig(e, fs, args, &c.db, &c.meters)
}

func cmdMeterCreate(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "meter create", meterCreateSynopsis+"\n\nThe new meter routes usage recorded after it.")
	var p meters.CreateParams
	fs.StringVar(&p.Key, "key", "", "the meter's key, [a-z0-9_]{1,40} (required)")
	fs.StringVar(&p.EventName, "event-name", "", "the Stripe meter's event name (required)")
	tokenType := fs.String("token-type", "", "input, cache_read, cache_write, output or reasoning (required)")
	models := fs.String("models", "*", "comma-separated model_id patterns: an exact id, a prefix ending in *, or *")
	var cfg meterConfig
	if err := cfg.load(e, fs, args); err != nil {
		return err
	}
	if err := fs.require("key", "event-name", "token-type"); err != nil {
		return err
	}
	p.TokenType = overage.TokenType(*tokenType)
	for _, m := range strings.Split(*models, ",") {
		p.Models = append(p.Models, strings.TrimSpace(m))
	}
	if err := p.Validate(); err != nil {
		return err
	}
	return withMeters(ctx, &cfg, func(s *meters.Store) error {
		m, err := s.Create(ctx, p)
		if err != nil {
			return fmt.Errorf("create meter: %w", err)
		}
		return printJSON(e.stdout, m)
	})
}

func cmdMeterList(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "meter list", meterListSynopsis)
	asJSON := fs.Bool("json", false, "print the JSON of GET /v1/meters")
	var cfg meterConfig
	if err := cfg.load(e, fs, args); err != nil {
		return err
	}
	return withMeters(ctx, &cfg, func(s *meters.Store) error {
		ms, err := s.List(ctx)
		if err != nil {
			return fmt.Errorf("list meters: %w", err)
		}
		if *asJSON {
			return printJSON(e.stdout, meters.List{Meters: ms})
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tEVENT NAME\tTOKEN TYPE\tMODELS\tARCHIVED")
		for _, m := range ms {
			archived := "-"
			if m.ArchivedAt != nil {
				archived = m.ArchivedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Key, m.EventName, m.TokenType, strings.Join(m.Models, ","), archived)
		}
		return tw.Flush()
	})
}

func cmdMeterArchive(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "meter archive", meterArchiveSynopsis+
		"\n\nThe meter stops routing usage recorded after it; what it already took stays on it and is billed. Archiving twice changes nothing.")
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
		return fs.parse(args[:1])
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return fs.usageError(errors.New("missing KEY"))
	}
	key := args[0]
	var cfg meterConfig
	if err := cfg.load(e, fs, args[1:]); err != nil {
		return err
	}
	return withMeters(ctx, &cfg, func(s *meters.Store) error {
		m, err := s.Archive(ctx, key)
		var appErr *overage.Error
		if errors.As(err, &appErr) && appErr.Code == overage.EINVALID {
			// The field is the API's "key"; here KEY is an argument, not
			// --key, and the message says it all.
			return errors.New("archive meter: " + appErr.Message)
		}
		if err != nil {
			return fmt.Errorf("archive meter: %w", err)
		}
		return printJSON(e.stdout, m)
	})
}
