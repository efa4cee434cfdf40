//go:build !dev

package idempotency

// buildLayout of the production build: always the production layout.
func buildLayout() layout { return production }
