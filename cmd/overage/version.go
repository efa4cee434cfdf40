package main

import (
	"runtime/debug"
	"strings"
)

// versionLine is the module version and the VCS commit the binary was
// built from, as the Go toolchain stamped them; "unknown" where it did not
// (go run, or a build outside a repository).
func versionLine() string {
	version, commit, when, modified := "(devel)", "unknown", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	parts := []string{"overage", version, "commit " + commit}
	if when != "" {
		parts = append(parts, "("+when+")")
	}
	if modified {
		parts = append(parts, "with uncommitted changes")
	}
	return strings.Join(parts, " ")
}
