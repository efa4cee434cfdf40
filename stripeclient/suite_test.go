package stripeclient_test

import (
	"testing"

	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/stripeclient/stripeclienttest"
)

// The same suite runs against both backends: stripe-mock proves the request
// shape against Stripe's published schema, the emulator proves it against
// the stateful rules the other tests rely on. If they ever disagree, the
// emulator is wrong.

func TestSuiteEmulator(t *testing.T) {
	t.Parallel()
	emu := emulator.New(emulator.Options{})
	t.Cleanup(emu.Close)
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatalf("starting emulator: %v", err)
	}
	stripeclienttest.Exercise(t, base, stripeclienttest.StripeMockKey)
}

func TestSuiteStripeMock(t *testing.T) {
	t.Parallel()
	base := stripeclienttest.StartStripeMock(t)
	stripeclienttest.Exercise(t, base, stripeclienttest.StripeMockKey)
}
