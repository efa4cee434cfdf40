package overage

import "time"

// Values fixed by Stripe or by the product, shared by every package that
// needs them: the configuration's defaults, the workers, review, reconcile
// and the tests all read them from here.
const (
	// DefaultMeterInputEvent and DefaultMeterOutputEvent are the meter
	// event names of the two dimensions (STRIPE_METER_INPUT_EVENT and
	// STRIPE_METER_OUTPUT_EVENT).
	DefaultMeterInputEvent  = "llm_input_tokens"
	DefaultMeterOutputEvent = "llm_output_tokens"

	// StripeIdempotencyWindow is how long Stripe remembers an idempotency
	// key and a meter event identifier (STRIPE_IDEMPOTENCY_WINDOW's
	// default). Past it, a resend could bill twice.
	StripeIdempotencyWindow = 24 * time.Hour

	// MaxFutureSkew is how far ahead of Stripe's clock a meter event's
	// timestamp may be; ingest refuses usage further ahead.
	MaxFutureSkew = 5 * time.Minute

	// MaxEventAge is how old a meter event's timestamp may be: Stripe
	// refuses older ones, so ingest does too.
	MaxEventAge = 35 * 24 * time.Hour
)
