package ingest

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestIngestTablesHaveOneOwner holds the tables an ingest request adds
// rows to to one owner each: the SQL that adds usage logs, the SQL of the
// idempotency records, the writes of the period totals and the statements
// on usage logs and reports are each in one
// place of the production tree (tests and their helpers, migrations and the benchmarks'
// seeding aside), so a second copy of the ingest protocol cannot grow
// back unnoticed.
func TestIngestTablesHaveOneOwner(t *testing.T) {
	t.Parallel()
	owners := []struct {
		what  string
		sql   *regexp.Regexp
		files []string // the only files allowed to hold it
	}{
		{"usage log inserts", regexp.MustCompile(`(?i)INSERT\s+INTO\s+usage_logs\b`), []string{"usagelog/insert.go"}},
		{"idempotency record SQL", regexp.MustCompile(`(?i)(INTO|FROM|UPDATE|TABLE|LIKE)\s+idempotency_keys\b`),
			[]string{"idempotency/records.go", "idempotency/partitions.go"}},
		{"period total writes", regexp.MustCompile(`(?i)(INTO|UPDATE|DELETE\s+FROM)\s+(allowance_usage|meter_usage)\b`), []string{"ingest/totals.go"}},
		{"usage log and report statements", regexp.MustCompile(`\b(FROM|JOIN|UPDATE|INTO)\s+(usage_logs|usage_reports)\b`), usagelogFiles(t)},
	}
	found := make([][]string, len(owners))
	root := ".."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if path == root {
				return nil
			}
			if strings.HasPrefix(d.Name(), ".") || rel == "migrations" || rel == "bench" || rel == "internal/testkit" || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, o := range owners {
			if o.sql.Match(src) {
				found[i] = append(found[i], rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range owners {
		if len(found[i]) == 0 {
			t.Errorf("%s: found in no file; the test no longer sees the tree (walked from %s)", o.what, root)
		}
		for _, f := range found[i] {
			if !slices.Contains(o.files, f) {
				t.Errorf("%s in %s: they belong in %s only", o.what, f, strings.Join(o.files, ", "))
			}
		}
	}
}

// usagelogFiles are the production files of package usagelog, the owner
// of usage_logs and usage_reports: every statement on them is in one of
// these (docs/architecture.md).
func usagelogFiles(t *testing.T) []string {
	t.Helper()
	names, err := filepath.Glob("../usagelog/*.go")
	if err != nil || len(names) == 0 {
		t.Fatalf("list usagelog's files: %v (%d)", err, len(names))
	}
	var out []string
	for _, n := range names {
		if !strings.HasSuffix(n, "_test.go") {
			out = append(out, "usagelog/"+filepath.Base(n))
		}
	}
	return out
}
