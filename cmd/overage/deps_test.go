package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestProductionBinaryCarriesNoTestKit lists the packages the production
// build links: the demo's test kit — testcontainers and the Docker client,
// the Stripe emulator, the flaky proxy — lives in the development build
// (-tags dev) only.
func TestProductionBinaryCarriesNoTestKit(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 || !slices.Contains(deps, "github.com/overage-billing/overage/app") {
		t.Fatalf("go list -deps listed %d packages, without app: not the binary's list", len(deps))
	}
	for _, d := range deps {
		for _, banned := range []string{"github.com/testcontainers/", "github.com/docker/", "/internal/flakyproxy", "/internal/pgcontainer", "/stripeclient/emulator", "/internal/testkit/"} {
			if strings.Contains(d, banned) {
				t.Errorf("the production binary links %s", d)
			}
		}
	}
	// The development build does carry them: the list above is the one
	// that leaves them out, not a list that never could hold them.
	out, err = exec.Command("go", "list", "-tags", "dev", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -tags dev -deps: %v", err)
	}
	if !slices.Contains(strings.Fields(string(out)), "github.com/overage-billing/overage/stripeclient/emulator") {
		t.Fatal("the development build does not link the Stripe emulator: is dev.go still behind the dev tag?")
	}
}
