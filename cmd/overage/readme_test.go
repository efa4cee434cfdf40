package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
)

// readmeSection is the heading of the README's production path.
const readmeSection = "## Running in production, step by step"

// productionSteps returns the shell block of the README's production path:
// the first ```sh block after its heading.
func productionSteps(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n"+readmeSection+"\n")
	if !ok {
		t.Fatalf("README.md has no %q section", readmeSection)
	}
	_, rest, ok = strings.Cut(rest, "\n```sh\n")
	if !ok {
		t.Fatalf("the %q section has no sh block", readmeSection)
	}
	block, _, ok := strings.Cut(rest, "\n```\n")
	if !ok {
		t.Fatal("the production path's sh block does not end")
	}
	return block + "\n"
}

// freeAddr is a loopback address with a port nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestReadmeProductionPath runs the README's numbered production steps as
// written — build, create and migrate the database, the emulator, serve
// and work, a meter, a tenant, an event, its billing, reconciliation — with only the
// database and the two ports replaced by the test's own.
func TestReadmeProductionPath(t *testing.T) {
	t.Parallel()
	steps := productionSteps(t)
	for i := 1; i <= 10; i++ {
		if !strings.Contains(steps, fmt.Sprintf("\n# %d. ", i)) && !strings.HasPrefix(steps, fmt.Sprintf("# %d. ", i)) {
			t.Errorf("the production path has no step %d", i)
		}
	}

	server := pgtest.ServerURL(t)
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	name := "ovgtest_readme_" + strings.ToLower(fmt.Sprintf("%x", time.Now().UnixNano()))
	u.Path = "/" + name
	t.Cleanup(func() {
		if c, err := pgx.Connect(context.Background(), server); err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(context.Background())
		}
	})
	for written, ours := range map[string]string{
		"postgres://postgres@localhost:5432/overage?sslmode=disable": u.String(),
		"127.0.0.1:8080":  freeAddr(t),
		"127.0.0.1:12180": freeAddr(t),
	} {
		if !strings.Contains(steps, written) {
			t.Fatalf("the production path no longer names %s", written)
		}
		steps = strings.ReplaceAll(steps, written, ours)
	}
	script := t.TempDir() + "/steps.sh"
	if err := os.WriteFile(script, []byte(steps), 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", script)
	cmd.Dir = "../.."
	// The process's own settings would change what the steps do.
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "STRIPE_") || strings.HasPrefix(k, "REPORT_") || strings.HasPrefix(k, "SWEEP_") ||
			k == "DATABASE_URL" || k == "LISTEN_ADDR" || k == "WORK_LISTEN_ADDR" || k == "ADMIN_TOKEN" || k == "LOG_LEVEL" || k == childEnv ||
			k == "PERIOD_CLOSE_GRACE" {
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	// The event is of yesterday: on the first of a month its period has
	// closed, and it would be billed (and reconciled) on today instead. A
	// grace past that keeps the path's output the same on every day.
	cmd.Env = append(cmd.Env, "PERIOD_CLOSE_GRACE=48h")
	// Its own process group, so serve, work and the emulator it starts in
	// the background go with it whatever happens.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	err = cmd.Wait()
	text := out.String()
	if err != nil {
		t.Fatalf("the production path failed: %v\n%s", err, text)
	}
	for _, want := range []string{
		"migrations applied: ", `"key":"cache_read"`, `"api_key":"ovg_`, `"overage":{"input_tokens":700,"output_tokens":350}`,
		`"meter":"cache_read","event_name":"llm_cache_read_tokens","tokens":400,"overage":400`,
		"OK: everything judged matches: 0 difference(s), 3 match(es), 0 too recent to judge",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the production path's output lacks %q:\n%s", want, text)
		}
	}
}

// TestReadmeConfigurationIsTheDefaultsTable: the README's configuration
// table lists exactly the variables the binary reads (app.Vars), in its
// order, each with the default the binary takes, or "(none…)" for one
// without.
func TestReadmeConfigurationIsTheDefaultsTable(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Configuration\n")
	if !ok {
		t.Fatal("README.md has no Configuration section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var names, defaults []string
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) < 3 || !strings.HasPrefix(cells[0], "| `") {
			continue
		}
		names = append(names, strings.Trim(cells[0], "| `"))
		defaults = append(defaults, cells[1])
	}
	var want []string
	for _, v := range app.Vars() {
		want = append(want, v.Name)
	}
	if !slices.Equal(names, want) {
		t.Fatalf("README's configuration table lists\n%v\nthe binary reads\n%v", names, want)
	}
	for i, v := range app.Vars() {
		if v.Default == "" && !strings.HasPrefix(defaults[i], "(none") {
			t.Errorf("README gives %s the default %s, the binary none", v.Name, defaults[i])
		}
		if v.Default != "" && defaults[i] != "`"+v.Default+"`" {
			t.Errorf("README gives %s the default %s, the binary `%s`", v.Name, defaults[i], v.Default)
		}
	}
}
