//go:build dev

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/internal/pgtest"
	"github.com/overage-billing/overage/internal/poll"
	"github.com/overage-billing/overage/internal/testkit/syncbuf"
	"math/rand/v2"
)

func TestDevDemoBillsEveryEventExactlyOnce(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	// A meter name other than the default: the demo compares what the
	// workers reported under, not a name of its own.
	out, _, err := runCmd(t, map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0", "STRIPE_METER_INPUT_EVENT": "demo_input_tokens"}, "dev", "--events", "80")
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
	if !strings.Contains(out, " demo_input_tokens ") || strings.Contains(out, " llm_input_tokens ") {
		t.Fatalf("the table does not show the configured input meter:\n%s", out)
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
	// Unique per run: every work tree's tests share this server, and a
	// fixed name would let one run's cleanup drop another's database.
	name := fmt.Sprintf("ovgtest_devcreate_%d", rand.Int64())
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

// TestDevKeepRunningPrintsAdminAccess runs the demo server and uses what
// it prints: the admin token opens the finance status, the tenants and
// River UI; /metrics carries the workers' Stripe call metrics too.
func TestDevKeepRunningPrintsAdminAccess(t *testing.T) {
	t.Parallel()
	for _, given := range []string{"", "admin-token-from-env-0123456789abcdef"} {
		env := map[string]string{"DATABASE_URL": pgtest.NewDatabase(t), "LISTEN_ADDR": "127.0.0.1:0", "ADMIN_TOKEN": given}
		ctx, cancel := context.WithCancel(context.Background())
		var out syncbuf.Buffer
		done := make(chan error, 1)
		go func() {
			// A few events with the generated token, so Stripe was called.
			events := map[bool]string{true: "3", false: "0"}[given == ""]
			done <- run(ctx, []string{"dev", "--events", events, "--keep-running"}, &out, io.Discard, func(k string) string { return env[k] })
		}()
		poll.Until(t, "the demo to print its admin access", 60*time.Second, func() bool { return strings.Contains(out.String(), "/riverui/api/jobs") })
		printed := out.String()
		token := regexp.MustCompile(`Admin token \([^)]*\):\n\n  (\S+)\n`).FindStringSubmatch(printed)
		base := regexp.MustCompile(`Serving on (http://\S+) until`).FindStringSubmatch(printed)
		if token == nil || base == nil || (given != "" && token[1] != given) || (given == "" && len(token[1]) < app.MinAdminTokenLen) {
			t.Fatalf("ADMIN_TOKEN=%q: no usable admin token or URL in:\n%s", given, printed)
		}
		for _, path := range []string{"/v1/billing/status", "/v1/tenants", "/riverui/api/jobs?state=available"} {
			if !strings.Contains(printed, "Authorization: Bearer "+token[1]+"' "+base[1]+path) && !strings.Contains(printed, "Authorization: Bearer "+token[1]+"' '"+base[1]+path) {
				t.Errorf("no ready-to-paste command for %s in:\n%s", path, printed)
			}
			req, _ := http.NewRequest(http.MethodGet, base[1]+path, nil)
			req.Header.Set("Authorization", "Bearer "+token[1])
			res, err := httpClient.Do(req)
			if err != nil || res.StatusCode != http.StatusOK {
				t.Fatalf("GET %s with the printed token: %v %v", path, res, err)
			}
			res.Body.Close()
		}
		res, err := httpClient.Get(base[1] + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		metricsText, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if given == "" && !strings.Contains(string(metricsText), "overage_stripe_calls_total") {
			t.Errorf("/metrics of overage dev lacks the Stripe call metrics")
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("overage dev after Ctrl-C: %v", err)
		}
	}
}
