package main

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// cmdVersion prints versionLine; --help says so instead.
func cmdVersion(e env, args []string) error {
	fs := newFlags(e, "version", "overage version\n\nPrints the module version and the commit this binary was built from (also: overage --version).")
	if err := fs.parse(args); err != nil {
		return err
	}
	_, err := fmt.Fprintln(e.stdout, versionLine())
	return err
}

// commit is set by `make build` (-ldflags -X main.commit=...) where the Go
// toolchain does not stamp vcs.revision itself.
var commit string

// versionLine is the module version and the VCS commit the binary was
// built from, as the Go toolchain stamped them; "unknown" where it did not
// (go run, or a build outside a repository).
func versionLine() string {
	version, rev, when, modified := "(devel)", commit, "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if rev == "" {
		rev = "unknown"
	}
	parts := []string{"overage", version, "commit " + rev}
	if when != "" {
		parts = append(parts, "("+when+")")
	}
	if modified {
		parts = append(parts, "with uncommitted changes")
	}
	return strings.Join(parts, " ")
}
