package pgtest

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestTemplateIsAnOrdinaryDatabaseAndStaleOnesGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	NewDatabase(t) // builds or finds the template
	server := ServerURL(t)
	name, err := ensureTemplate(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(ctx) })
	// dropdb refuses an IS_TEMPLATE database; the template is not one.
	var isTemplate bool
	var comment string
	if err := admin.QueryRow(ctx, "SELECT datistemplate, shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1", name).Scan(&isTemplate, &comment); err != nil {
		t.Fatal(err)
	}
	if isTemplate || len(comment) <= len(templateComment) || comment[:len(templateComment)] != templateComment {
		t.Fatalf("template %s: IS_TEMPLATE %v, comment %q", name, isTemplate, comment)
	}

	// Another migration set's templates: one two days old goes, one an
	// hour old stays (another work tree may be cloning it).
	suffix := randomHex(4)
	stale, fresh := "ovgtmpl_stale"+suffix, "ovgtmpl_fresh"+suffix
	for db, age := range map[string]time.Duration{stale: 48 * time.Hour, fresh: time.Hour} {
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db) })
		c := templateComment + time.Now().Add(-age).UTC().Format(time.RFC3339)
		if _, err := admin.Exec(ctx, fmt.Sprintf("COMMENT ON DATABASE %s IS '%s'", db, c)); err != nil {
			t.Fatal(err)
		}
	}
	dropStaleTemplates(ctx, admin, name)
	var left []string
	rows, err := admin.Query(ctx, "SELECT datname FROM pg_database WHERE datname IN ($1, $2, $3) ORDER BY datname", stale, fresh, name)
	if err == nil {
		left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Fatal(err)
	}
	want := []string{fresh, name}
	sort.Strings(want)
	sort.Strings(left)
	if fmt.Sprint(left) != fmt.Sprint(want) {
		t.Fatalf("after dropping stale templates: %v, want %s and %s", left, fresh, name)
	}
}
