// Command stripe-emulator serves the stateful Stripe emulator in its own
// process, for a chaos test that runs the worker as a child process or for a
// human trying the pipeline without Stripe.
//
//	stripe-emulator -addr 127.0.0.1:12180 -seed 7 -lost 0.1 -5xx 0.05 -429 0.05 -latency 20ms
//
// The first line on stdout is the base URL, to use as STRIPE_API_BASE; any
// sk_ key is accepted unless -api-key is given. State can be read as JSON
// from <base>/_emulator/applied, /_emulator/events and /_emulator/requests,
// and faults changed with POST <base>/_emulator/faults. It stops on SIGINT
// or SIGTERM.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/overage-billing/overage/stripeclient/emulator"
)

func main() {
	os.Exit(exitStatus(run(os.Args[1:])))
}

// exitStatus prints err as one line on stderr and returns the exit
// status: 0 on success or -h, 2 on a bad flag, 1 otherwise.
func exitStatus(err error) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(os.Stderr, "stripe-emulator:", err)
	if errors.As(err, new(*usageError)) {
		fmt.Fprintln(os.Stderr, "run \"stripe-emulator -h\" for its flags")
		return 2
	}
	return 1
}

// usageError is a command line that does not parse.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func run(args []string) error {
	fs := flag.NewFlagSet("stripe-emulator", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:12180", "address to listen on; port 0 picks a free one")
	seed := fs.Int64("seed", 1, "seed of the fault injection")
	lost := fs.Float64("lost", 0, "fraction of applied meter events whose response is dropped")
	serverErr := fs.Float64("5xx", 0, "fraction of meter event requests answered 500 before applying")
	rateLimit := fs.Float64("429", 0, "fraction of meter event requests answered 429 before applying")
	latency := fs.Duration("latency", 0, "delay added to every meter event request")
	callsPerSecond := fs.Float64("rate-limit", emulator.DefaultRateLimit, "meter event calls per second per account; above it 429 (Stripe's live-mode limit); negative: none")
	blackhole := fs.String("blackhole", "", "comma-separated customers whose requests never get an answer")
	apiKey := fs.String("api-key", "", "the only secret key accepted (default: any sk_ or rk_ key)")
	keyTTL := fs.Duration("key-ttl", emulator.DefaultKeyTTL, "how long idempotency keys are remembered")
	idTTL := fs.Duration("identifier-ttl", emulator.DefaultIdentifierTTL, "how long meter event identifiers stay unique")
	verbose := fs.Bool("v", false, "log every request to stderr")
	// The flag package would print the usage on stderr after any error:
	// -h prints it on stdout, a bad flag is one line.
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stdout, "Usage: stripe-emulator [flags]\n\nServes a stateful Stripe emulator; prints its base URL (STRIPE_API_BASE) on the first line.\n\nFlags:")
			fs.SetOutput(os.Stdout)
			fs.PrintDefaults()
			return err
		}
		return &usageError{err}
	}
	for name, r := range map[string]float64{"-lost": *lost, "-5xx": *serverErr, "-429": *rateLimit} {
		if r < 0 || r > 1 {
			return fmt.Errorf("%s %v is not in [0, 1]", name, r)
		}
	}

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	opts := emulator.Options{
		Seed: *seed,
		Faults: emulator.Faults{
			ServerErrorRate:  *serverErr,
			LostResponseRate: *lost,
			RateLimitRate:    *rateLimit,
			Latency:          *latency,
		},
		KeyTTL:        *keyTTL,
		IdentifierTTL: *idTTL,
		RateLimit:     *callsPerSecond,
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}
	if *blackhole != "" {
		opts.Faults.BlackholeCustomers = strings.Split(*blackhole, ",")
	}
	if *apiKey != "" {
		opts.APIKeys = []string{*apiKey}
	}

	emu := emulator.New(opts)
	base, err := emu.Start(*addr)
	if err != nil {
		return err
	}
	fmt.Println(base)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	emu.Close()
	return nil
}
