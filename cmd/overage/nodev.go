//go:build !dev

package main

import (
	"context"
	"errors"
)

// cmdDev of the production build: the demo, the Stripe emulator and
// testcontainers are in the development build only (-tags dev, as
// `make run` builds it), so a production binary carries none of them.
func cmdDev(_ context.Context, e env, args []string) error {
	fs := newFlags(e, "dev", devSynopsis+"\n\nOnly in the development build: `make run`, or go build -tags dev ./cmd/overage.")
	fs.Int("events", 300, "usage events in the demo burst")
	fs.Bool("keep-running", false, "keep serving after the demo, printing the URL and a curl command")
	if err := loadConfig(e, fs, args); err != nil {
		return err
	}
	return errors.New("overage dev is not in this build: it is in the development build, which `make run` builds (go build -tags dev ./cmd/overage)")
}
