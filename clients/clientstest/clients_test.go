package clientstest

import (
	"bytes"
	"context"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overage-billing/overage/alerts"
	"github.com/overage-billing/overage/internal/testkit/apitest"
	"github.com/overage-billing/overage/internal/testkit/aptinstall"
)

// live is a real server with a tenant, and a proxy to it that loses the
// first answer of every Idempotency-Key.
type live struct {
	url, lossyURL, apiKey string
	srv                   *apitest.Server
}

func startLive(t *testing.T) *live {
	t.Helper()
	srv := apitest.Start(t)
	origin, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	lossy := httptest.NewServer(&loseFirstAnswer{proxy: httputil.NewSingleHostReverseProxy(origin), seen: map[string]bool{}})
	t.Cleanup(lossy.Close)
	return &live{url: srv.URL, lossyURL: lossy.URL, apiKey: srv.Tenant(t, "clients", 0, 0).APIKey, srv: srv}
}

func (l *live) env() []string {
	// An alert delivery as the server's deliverer signs it (alerts.Sign
	// over alerts.Event.Body), for the clients' verifiers to check.
	secret, err := alerts.NewSecret()
	if err != nil {
		panic(err)
	}
	ev := alerts.Event{ID: "evt_0193a1b2c3d4e5f60718293a4b5c6d7e", Type: alerts.EventType, Created: time.Now().UTC(),
		Data: alerts.EventData{Meter: "input", PeriodStart: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), ThresholdPercent: 80, Included: 100000, Used: 80500}}
	body := ev.Body()
	return []string{"OVERAGE_URL=" + l.url, "OVERAGE_LOSSY_URL=" + l.lossyURL, "OVERAGE_API_KEY=" + l.apiKey,
		"OVERAGE_WEBHOOK_SECRET=" + secret, "OVERAGE_WEBHOOK_BODY=" + string(body), "OVERAGE_WEBHOOK_SIGNATURE=" + alerts.Sign(secret, time.Now(), body)}
}

// loseFirstAnswer lets the server execute the first request of each
// Idempotency-Key to the end, then closes the client's connection without
// the answer: the answer lost after the commit. Later requests of the key
// pass through.
type loseFirstAnswer struct {
	proxy *httputil.ReverseProxy
	mu    sync.Mutex
	seen  map[string]bool
}

func (p *loseFirstAnswer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	first := key != "" && !p.seen[key]
	p.seen[key] = true
	p.mu.Unlock()
	if !first {
		p.proxy.ServeHTTP(w, r)
		return
	}
	p.proxy.ServeHTTP(httptest.NewRecorder(), r)
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close()
	}
}

// run runs name with args in dir, failing t with the output on error.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	// The servers are on loopback: never through a proxy of the environment.
	cmd.Env = append(append(os.Environ(), "NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost"), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

func clientsDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

var (
	pyRan     = regexp.MustCompile(`(?m)^Ran (\d+) tests? in`)
	pyOK      = regexp.MustCompile(`(?m)^OK$`)
	pyLiveRan = regexp.MustCompile(`(?m)^test_\w+ \(test_live\.LiveTest[.\w]*\) \.\.\. ok$`)
)

// TestPythonClient installs clients/python with pip, offline, and runs its
// suite against the installed package: unit tests, the shared retry cases
// and the live tests against a real server. Nothing may be skipped.
func TestPythonClient(t *testing.T) {
	t.Parallel()
	python := aptinstall.Command(t, "python3", "python3")
	aptinstall.Command(t, "pip3", "python3-pip")
	l := startLive(t)
	src := filepath.Join(clientsDir(t), "python")
	site := t.TempDir()
	// Offline: the package's build backend needs nothing from an index.
	// PIP_BREAK_SYSTEM_PACKAGES lets Debian's pip install into a --target.
	run(t, src, []string{"PIP_NO_INDEX=1", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_BREAK_SYSTEM_PACKAGES=1"},
		python, "-m", "pip", "install", "--no-index", "--no-cache-dir", "--target", site, src)
	if _, err := os.Stat(filepath.Join(site, "overage", "py.typed")); err != nil {
		t.Fatalf("pip install left no overage/py.typed: %v", err)
	}
	env := append(l.env(), "PYTHONPATH="+site+string(os.PathListSeparator)+filepath.Join(src, "tests"), "PYTHONDONTWRITEBYTECODE=1", "PYTHONSAFEPATH=1")
	out := run(t, filepath.Join(src, "tests"), env, python, "-m", "unittest", "discover", "-v", "-s", ".", "-t", ".")
	// The suite imports the installed copy, not src/.
	where := run(t, filepath.Join(src, "tests"), env, python, "-c", "import overage; print(overage.__file__)")
	if !strings.HasPrefix(strings.TrimSpace(where), site) {
		t.Fatalf("the suite imported overage from %s, not the installed %s", where, site)
	}
	m := pyRan.FindStringSubmatch(out)
	if m == nil || !pyOK.MatchString(out) || strings.Contains(out, "skipped") {
		t.Fatalf("python suite did not pass without skips:\n%s", out)
	}
	if n := len(pyLiveRan.FindAllString(out, -1)); n < 6 {
		t.Fatalf("%d live tests passed, want at least 6:\n%s", n, out)
	}
	t.Logf("python: %s tests passed (%s)", m[1], strings.TrimSpace(run(t, src, nil, python, "--version")))
}

var nodeCount = regexp.MustCompile(`(?m)^# (tests|pass|fail|cancelled|skipped|todo) (\d+)$`)

func nodeCounts(out string) map[string]int {
	c := map[string]int{}
	for _, m := range nodeCount.FindAllStringSubmatch(out, -1) {
		c[m[1]], _ = strconv.Atoi(m[2])
	}
	return c
}

// TestTypeScriptClient builds clients/typescript with tsc (npm ci fetches
// typescript, its only, development, dependency) in a copy of the folder,
// runs its suite, then its live tests against a real server. Nothing may be
// skipped.
func TestTypeScriptClient(t *testing.T) {
	t.Parallel()
	aptinstall.Command(t, "node", "nodejs")
	npm := aptinstall.Command(t, "npm", "npm")
	l := startLive(t)
	work := t.TempDir()
	copyTree(t, filepath.Join(clientsDir(t), "typescript"), filepath.Join(work, "typescript"))
	copyTree(t, filepath.Join(clientsDir(t), "testdata"), filepath.Join(work, "testdata"))
	dir := filepath.Join(work, "typescript")
	env := []string{"npm_config_audit=false", "npm_config_fund=false", "npm_config_update_notifier=false"}
	run(t, dir, env, npm, "ci")
	if _, err := os.Stat(filepath.Join(dir, "dist", "index.d.ts")); err != nil {
		t.Fatalf("npm ci built no dist/index.d.ts: %v", err)
	}
	out := run(t, dir, env, npm, "test")
	if c := nodeCounts(out); c["pass"] < 40 || c["fail"] != 0 || c["cancelled"] != 0 {
		t.Fatalf("typescript suite: %v\n%s", c, out)
	}
	consumerInstalls(t, work, npm, env)
	out = run(t, dir, append(env, l.env()...), "node", "--test", "test/live.test.mjs")
	if c := nodeCounts(out); c["pass"] < 6 || c["fail"] != 0 || c["skipped"] != 0 || c["cancelled"] != 0 {
		t.Fatalf("typescript live tests: %v\n%s", c, out)
	}
}

// consumerInstalls installs the built package into another project with
// npm install <folder>, imports it from plain JavaScript and type-checks
// TypeScript written against its declarations.
func consumerInstalls(t *testing.T, work, npm string, env []string) {
	t.Helper()
	dir := filepath.Join(work, "consumer")
	files := map[string]string{
		"package.json": `{"name":"consumer","version":"1.0.0","private":true,"type":"module"}`,
		"tsconfig.json": `{"compilerOptions":{"module":"NodeNext","moduleResolution":"NodeNext","target":"ES2022","strict":true,"noEmit":true,` +
			`"lib":["ES2022","DOM"],"types":[]},"files":["check.ts"]}`,
		"check.ts": `import { Client, fromOpenAI, OverageError, type RecordResult } from "overage-client";
const c = new Client({ baseUrl: "http://127.0.0.1:1", apiKey: "k", maxAttempts: 1 });
const ev = fromOpenAI({ id: "chatcmpl-1", model: "gpt-4o", usage: { prompt_tokens: 3, completion_tokens: 1 } });
const p: Promise<RecordResult> = c.record({ userId: "u_42", ...ev });
p.catch((e: unknown) => { if (!(e instanceof OverageError)) throw e; });
`,
		"check.mjs": `import { Client, verifyWebhook, signWebhook } from "overage-client";
const sig = signWebhook("{}", "whsec_x", 1000);
if (typeof Client !== "function" || verifyWebhook("{}", sig, "whsec_x", { now: 1000 }) === null) process.exit(1);
console.log("imported");
`,
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(t, dir, env, npm, "install", "--no-save", "../typescript")
	if out := run(t, dir, nil, "node", "check.mjs"); strings.TrimSpace(out) != "imported" {
		t.Fatalf("node check.mjs printed %q", out)
	}
	run(t, dir, nil, filepath.Join(work, "typescript", "node_modules", ".bin", "tsc"), "-p", "tsconfig.json")
}

// copyTree copies the files of src to dst, leaving out node_modules and dist.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			if d.Name() == "node_modules" || d.Name() == "dist" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
