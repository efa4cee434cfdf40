package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage/internal/pgtest"
)

func TestDevDemoBillsEveryEventExactlyOnce(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	out, _, err := runCmd(t, map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0"}, "dev", "--events", "80")
	if err != nil {
		t.Fatalf("overage dev: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.Contains(lines[0], "built-in Stripe emulator") || !strings.Contains(lines[0], "nothing is sent to Stripe") {
		t.Fatalf("first line does not say where usage is reported: %q", lines[0])
	}
	if !strings.Contains(lines[len(lines)-1], "every demo event billed exactly once") {
		t.Fatalf("last line: %q\n%s", lines[len(lines)-1], out)
	}
	if !strings.Contains(out, "80 events") || !strings.Contains(out, ": 80 usage logs") {
		t.Fatalf("the summary does not count 80 events and 80 logs:\n%s", out)
	}
	if strings.Contains(out, " NO\n") {
		t.Fatalf("a row disagrees:\n%s", out)
	}
}

func TestDevCreatesAMissingDatabase(t *testing.T) {
	t.Parallel()
	server := pgtest.ServerURL(t)
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("ovgtest_devcreate_%s", strings.ReplaceAll(t.Name()[len(t.Name())-8:], "_", ""))
	u.Path = "/" + strings.ToLower(name)
	t.Cleanup(func() {
		if c, err := pgx.Connect(context.Background(), server); err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+strings.ToLower(name)+" WITH (FORCE)")
			c.Close(context.Background())
		}
	})
	var out strings.Builder
	got, stop, err := devDatabase(context.Background(), u.String(), &out)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if got != u.String() || !strings.Contains(out.String(), "created") {
		t.Fatalf("devDatabase = %q, printed %q", got, out.String())
	}
	c, err := pgx.Connect(context.Background(), got)
	if err != nil {
		t.Fatalf("the created database does not answer: %v", err)
	}
	c.Close(context.Background())
}

func TestDevSaysHowToProvideADatabase(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	// Port 1 answers nothing; Docker is not running on these machines, and
	// where it is, this test would start a container — so only run the
	// check when the error path is taken.
	_, stop, err := devDatabase(context.Background(), "postgres://postgres@127.0.0.1:1/overage?sslmode=disable&connect_timeout=2", &out)
	if err == nil {
		stop()
		t.Skip("Docker answered: testcontainers provided a database")
	}
	for _, want := range []string{"DATABASE_URL", "Docker", "postgres://"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}
