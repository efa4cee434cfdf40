package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/reconcile"
)

// binary runs the test binary as `overage args...` (see TestMain) with env
// as its whole environment, and returns its stdout, stderr and exit status.
// A command still running after two minutes is killed (exit status -1): a
// long-running command that should have refused to start fails its test
// instead of hanging it.
func binary(t *testing.T, env map[string]string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = []string{childEnv + "=" + strings.Join(args, " ")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// oneLine fails unless stderr is exactly one "overage: ..." line, free of
// internal codes, and returns it.
func oneLine(t *testing.T, what, stderr string) string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "overage: ") {
		t.Fatalf("%s: stderr is not one error line: %q", what, stderr)
	}
	for _, slug := range []string{"(not_found)", "(invalid)", "not-found", "validation-failed", "overage: overage:"} {
		if strings.Contains(lines[0], slug) {
			t.Fatalf("%s: the error shows %q: %q", what, slug, lines[0])
		}
	}
	return lines[0]
}

func TestCLIErrorsAreOneLineOnStderrInWords(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	env := map[string]string{"DATABASE_URL": dbURL}

	out, stderr, code := binary(t, env, "tenant", "show", "0192f3a4-5b6c-7d8e-9f01-23456789abcd")
	if line := oneLine(t, "unknown tenant", stderr); code != 1 || out != "" || !strings.Contains(line, "tenant 0192f3a4-5b6c-7d8e-9f01-23456789abcd not found") {
		t.Fatalf("unknown tenant: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	out, stderr, code = binary(t, env, "tenant", "create", "--name", "Acme", "--stripe-customer", "acme")
	if line := oneLine(t, "invalid tenant", stderr); code != 1 || out != "" || !strings.Contains(line, "--stripe-customer must be") {
		t.Fatalf("invalid tenant: exit %d, stdout %q, stderr %q", code, out, stderr)
	}

	// A usage error: the error once, then the synopsis, all on stderr.
	out, stderr, code = binary(t, env, "status", "--bogus")
	if code != 2 || out != "" || strings.Count(stderr, "-bogus") != 1 || !strings.Contains(stderr, "usage: overage status") {
		t.Fatalf("bad flag: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	// An unknown command: the error and where the list is, not the whole
	// usage; a near miss names the command meant.
	out, stderr, code = binary(t, env, "bill-everyone")
	if code != 2 || out != "" || strings.Count(stderr, `unknown command "bill-everyone"`) != 1 || !strings.Contains(stderr, `"overage --help" lists the commands`) ||
		strings.Count(stderr, "\n") != 2 || strings.Contains(stderr, "did you mean") {
		t.Fatalf("unknown command: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	for typo, want := range map[string]string{"serv": "serve", "migrat": "migrate", "recnocile": "reconcile", "statsu": "status"} {
		out, stderr, code = binary(t, env, typo)
		if code != 2 || out != "" || !strings.Contains(stderr, `(did you mean "`+want+`"?)`) || strings.Count(stderr, "\n") != 2 {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", typo, code, out, stderr)
		}
	}

	// A missing required flag is a usage error: 2, with the synopsis.
	for _, tc := range []struct {
		args     []string
		missing  string
		synopsis string
	}{
		{[]string{"tenant", "create", "--name", "Acme"}, "--stripe-customer", "usage: overage tenant create"},
		{[]string{"tenant", "create"}, "--name, --stripe-customer", "usage: overage tenant create"},
		{[]string{"review", "resolve", "0192f3a4-5b6c-7d8e-9f01-23456789abcd", "--as", "void"}, "--reason", "usage: overage review resolve"},
	} {
		out, stderr, code = binary(t, env, tc.args...)
		if code != 2 || out != "" || !strings.Contains(stderr, "overage: missing required flag(s) "+tc.missing+"\n") || !strings.Contains(stderr, tc.synopsis) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", tc.args, code, out, stderr)
		}
	}

	// A connection string that does not parse is named as where it came
	// from, in one balanced message, without its password.
	const password = "pw-in-a-bad-url"
	bad := "postgres://app:" + password + "@db.example:notaport/overage"
	out, stderr, code = binary(t, env, "status", "--database-url", bad)
	if code != 2 || out != "" || !strings.Contains(stderr, "overage: --database-url: cannot parse the connection string") || strings.Contains(stderr, password) || strings.Contains(stderr, "`") {
		t.Errorf("a bad --database-url: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	_, stderr, code = binary(t, map[string]string{"DATABASE_URL": bad}, "status")
	if line := oneLine(t, "a bad DATABASE_URL", stderr); code != 1 || !strings.Contains(line, "DATABASE_URL: cannot parse the connection string (want ") || strings.Contains(line, password) || strings.Contains(line, "`") {
		t.Errorf("a bad DATABASE_URL: exit %d, stderr %q", code, stderr)
	}
}

func TestVersionAndWorkHelpSayWhatTheyDo(t *testing.T) {
	t.Parallel()
	out, stderr, code := binary(t, nil, "version", "--help")
	if code != 0 || stderr != "" || !strings.HasPrefix(out, "Usage: overage version\n") || strings.Contains(out, versionLine()) || strings.Contains(out, "Flags") {
		t.Errorf("version --help: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	out, _, code = binary(t, nil, "work", "--help")
	for _, v := range []string{"STRIPE_SECRET_KEY", "STRIPE_API_BASE", "SWEEP_INTERVAL", "WORK_LISTEN_ADDR", "--database-url"} {
		if code != 0 || !strings.Contains(out, v) {
			t.Errorf("work --help does not name %s (exit %d):\n%s", v, code, out)
		}
	}
}

func TestCLIHelpGoesToStdoutWithoutSecrets(t *testing.T) {
	t.Parallel()
	const password = "hunter2-db-password"
	env := map[string]string{"DATABASE_URL": "postgres://app:" + password + "@db.example:5432/overage", "ADMIN_TOKEN": "admin-tok-help", "STRIPE_SECRET_KEY": "sk_test_helpsecret"}
	for _, args := range [][]string{{"--help"}, {"status", "--help"}, {"serve", "--help"}, {"work", "--help"}, {"migrate", "--help"},
		{"dev", "--help"}, {"tenant", "--help"}, {"tenant", "create", "--help"}, {"tenant", "list", "--help"}, {"tenant", "show", "--help"},
		{"tenant", "update", "--help"}, {"tenant", "key", "create", "--help"}, {"tenant", "key", "revoke", "--help"},
		{"reconcile", "--help"}, {"review", "--help"}, {"review", "list", "--help"},
		{"meter", "--help"}, {"meter", "create", "--help"}, {"meter", "list", "--help"}, {"meter", "archive", "--help"}} {
		out, stderr, code := binary(t, env, args...)
		if code != 0 || stderr != "" || !strings.Contains(out, "overage") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, stderr)
		}
		for _, secret := range []string{password, env["ADMIN_TOKEN"], env["STRIPE_SECRET_KEY"]} {
			if strings.Contains(out, secret) {
				t.Errorf("%v prints a secret: %s", args, out)
			}
		}
	}
}

func TestCLIReadsOnlyTheSettingsItUses(t *testing.T) {
	t.Parallel()
	_, dbURL := pgtest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL, "SWEEP_INTERVAL": "ten minutes", "REPORT_MAX_ATTEMPTS": "many"}
	if out, stderr, code := binary(t, env, "status"); code != 0 || !strings.Contains(out, "TOTAL") {
		t.Fatalf("status with a bad SWEEP_INTERVAL: exit %d, %q %q", code, out, stderr)
	}
	if _, stderr, code := binary(t, env, "tenant", "list"); code != 0 {
		t.Fatalf("tenant list with a bad SWEEP_INTERVAL: exit %d, %q", code, stderr)
	}
	if _, stderr, code := binary(t, env, "meter", "list"); code != 0 {
		t.Fatalf("meter list with a bad SWEEP_INTERVAL: exit %d, %q", code, stderr)
	}
	// A command that uses it still refuses it, naming it.
	_, stderr, code := binary(t, env, "work")
	if line := oneLine(t, "work", stderr); code != 1 || !strings.Contains(line, "SWEEP_INTERVAL") {
		t.Fatalf("work with a bad SWEEP_INTERVAL: exit %d, %q", code, stderr)
	}
}

func TestCLISaysToMigrateAnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	// A fresh database: the cloned one, its tables dropped.
	pool, dbURL := pgtest.NewPool(t)
	if _, err := pool.Exec(context.Background(), `DROP SCHEMA public CASCADE; CREATE SCHEMA public`); err != nil {
		t.Fatal(err)
	}
	// serve and work would otherwise start, log that they serve and fail
	// every request (serve's /readyz answering ready).
	env := map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0", "STRIPE_SECRET_KEY": "sk_test_unmigrated", "STRIPE_API_BASE": "http://127.0.0.1:1"}
	for _, args := range [][]string{{"status"}, {"tenant", "list"}, {"tenant", "create", "--name", "A", "--stripe-customer", "cus_a"}, {"review", "list"},
		{"meter", "list"}, {"meter", "create", "--key", "k", "--event-name", "e", "--token-type", "input"}, {"serve"}, {"work"}} {
		_, stderr, code := binary(t, env, args...)
		if line := oneLine(t, strings.Join(args, " "), stderr); code != 1 || !strings.Contains(line, "run `overage migrate`") {
			t.Errorf("%v on an unmigrated database: exit %d, %q", args, code, stderr)
		}
	}
}

func TestServeAndWorkRefuseADatabaseMissingAMigration(t *testing.T) {
	t.Parallel()
	// Migrated by an older binary: the newest migration is not recorded.
	pool, dbURL := pgtest.NewPool(t)
	var newest int
	if err := pool.QueryRow(context.Background(), `DELETE FROM overage_schema_migrations WHERE version = (SELECT max(version) FROM overage_schema_migrations) RETURNING version`).Scan(&newest); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0", "STRIPE_SECRET_KEY": "sk_test_older", "STRIPE_API_BASE": "http://127.0.0.1:1"}
	for _, cmd := range []string{"serve", "work"} {
		_, stderr, code := binary(t, env, cmd)
		line := oneLine(t, cmd, stderr)
		if code != 1 || !strings.Contains(line, "run `overage migrate`") || !strings.Contains(line, fmt.Sprint(newest)) {
			t.Errorf("%s on a database without migration %d: exit %d, %q", cmd, newest, code, stderr)
		}
	}
}

func TestMigrateSaysToCreateAMissingDatabase(t *testing.T) {
	t.Parallel()
	server := pgtest.ServerURL(t)
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("ovgtest_missing_%d", rand.Int64())
	u.Path = "/" + name
	t.Cleanup(func() {
		if c, err := pgx.Connect(context.Background(), server); err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(context.Background())
		}
	})
	env := map[string]string{"DATABASE_URL": u.String()}
	out, stderr, code := binary(t, env, "migrate")
	line := oneLine(t, "migrate of a missing database", stderr)
	if code != 1 || out != "" || !strings.Contains(line, name) || !strings.Contains(line, "does not exist") ||
		!strings.Contains(line, "--create-database") || strings.Contains(line, "cannot reach") {
		t.Fatalf("migrate of a missing database: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	out, stderr, code = binary(t, env, "migrate", "--create-database")
	// One line per thing done on stdout; the migrators' JSON logs nowhere.
	if code != 0 || !strings.HasPrefix(out, "created the database\napplied River's migrations 001 to ") || !strings.Contains(out, "\napplied 0001_init\n") || stderr != "" {
		t.Fatalf("migrate --create-database: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	// A new database's empty first partitions end at the current day and
	// month (usagelog.FitFirstPartition): this month has its own.
	month := time.Now().UTC().Format("200601")
	if !strings.Contains(out, "\nended the empty first idempotency record partition at the current day\n") ||
		!strings.Contains(out, "\nended the empty first usage log partition at the current month\ncreated partition usage_logs_p"+month+"\n") {
		t.Fatalf("migrate --create-database did not fit the first partitions: stdout %q", out)
	}
	// Again: nothing to create, nothing to apply, one line.
	out, stderr, code = binary(t, env, "migrate", "--create-database")
	if code != 0 || out != "migrations applied: 0 river, 0 overage\n" || stderr != "" {
		t.Fatalf("migrate --create-database again: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	if out, stderr, code := binary(t, env, "status"); code != 0 || !strings.Contains(out, "TOTAL") {
		t.Fatalf("status on the created database: exit %d, %q %q", code, out, stderr)
	}
}

func TestVersionPrintsModuleVersionAndCommit(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, _, err := runCmd(t, nil, args...)
		if err != nil || !strings.HasPrefix(out, "overage ") || !strings.Contains(out, "commit ") {
			t.Fatalf("%v: %q %v", args, out, err)
		}
	}
	// A real build, as `make build` makes it, carries the commit.
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout (%v): no commit to compare with", err)
	}
	bin := t.TempDir() + "/overage"
	if out, err := exec.Command("make", "-s", "-C", "../..", "build", "BIN="+bin).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(out), "commit "+strings.TrimSpace(string(head))) || strings.Contains(string(out), "(devel) commit unknown") {
		t.Fatalf("overage version = %q (%v), want the commit %s", out, err, head)
	}
}

func TestReconcileSaysWhenNothingCouldBeJudged(t *testing.T) {
	t.Parallel()
	tooRecent := &reconcile.Result{From: "2026-11-29", To: "2026-11-30", TooRecentFrom: "2026-11-29",
		Rows: []reconcile.Row{{Status: reconcile.StatusTooRecent}}, TooRecent: 1}
	if msg := nothingJudged(tooRecent); !strings.Contains(msg, "nothing could be judged yet") {
		t.Fatalf("every window too recent: %q", msg)
	}
	if msg := nothingJudged(&reconcile.Result{From: "2026-11-30", To: "2026-11-30", TooRecentFrom: "2026-11-30"}); msg == "" {
		t.Fatal("an empty range that is too recent said nothing")
	}
	judged := &reconcile.Result{From: "2026-11-01", To: "2026-11-02", Rows: []reconcile.Row{{Status: reconcile.StatusMatch}, {Status: reconcile.StatusTooRecent}}}
	if msg := nothingJudged(judged); msg != "" {
		t.Fatalf("a range with a judged window: %q", msg)
	}
}

func TestCLISaysWhenPostgreSQLDoesNotAnswer(t *testing.T) {
	t.Parallel()
	const password = "pw-never-printed"
	env := map[string]string{"DATABASE_URL": "postgres://postgres:" + password + "@127.0.0.1:1/overage?sslmode=disable&connect_timeout=2"}
	_, stderr, code := binary(t, env, "tenant", "list")
	line := oneLine(t, "no database", stderr)
	if code != 1 || !strings.Contains(line, "cannot reach PostgreSQL") || strings.Contains(line, password) {
		t.Fatalf("unreachable database: exit %d, %q", code, stderr)
	}
}
