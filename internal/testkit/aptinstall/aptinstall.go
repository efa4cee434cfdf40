// Package aptinstall finds a command a test needs and, where it is
// missing, installs its Debian package, so the browser and promtool tests
// run on a fresh machine instead of being skipped there.
package aptinstall

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

var (
	mu      sync.Mutex
	updated bool
	found   = map[string]result{}
)

type result struct {
	path string
	err  error
}

// Command returns the path of command, installing package pkg with
// apt-get when it is missing (apt-get update once per process). Where it
// can be neither found nor installed (no apt-get, not root, no network) the
// test is skipped, saying why.
func Command(t testing.TB, command, pkg string, paths ...string) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	r, ok := found[command]
	if !ok {
		r = install(command, pkg, paths)
		found[command] = r
	}
	if r.err != nil {
		t.Skipf("%s is needed and could not be installed: %v", command, r.err)
	}
	return r.path
}

func lookPath(command string, paths []string) (string, error) {
	if p, err := exec.LookPath(command); err == nil {
		return p, nil
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", command)
}

func install(command, pkg string, paths []string) result {
	if p, err := lookPath(command, paths); err == nil {
		return result{path: p}
	}
	if _, err := exec.LookPath("apt-get"); err != nil || os.Geteuid() != 0 {
		return result{err: fmt.Errorf("%s is not installed, and apt-get is missing or this is not root (uid %d): install Debian's %s", command, os.Geteuid(), pkg)}
	}
	steps := [][]string{{"install", "-y", "--no-install-recommends", pkg}}
	if !updated {
		steps = append([][]string{{"update"}}, steps...)
	}
	for _, args := range steps {
		// Another process may hold the dpkg lock (apt in a parallel test
		// binary): wait for it rather than fail.
		cmd := exec.Command("apt-get", append([]string{"-o", "DPkg::Lock::Timeout=600"}, args...)...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return result{err: fmt.Errorf("apt-get %s: %v: %s", strings.Join(args, " "), err, lastLines(string(out), 5))}
		}
		if args[0] == "update" {
			updated = true
		}
	}
	p, err := lookPath(command, paths)
	return result{path: p, err: err}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
