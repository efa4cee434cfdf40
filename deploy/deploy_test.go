package deploy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/overage-billing/overage/alerts"
	"github.com/overage-billing/overage/internal/testkit/apitest"
	"github.com/overage-billing/overage/internal/testkit/aptinstall"
	"github.com/overage-billing/overage/metrics"
	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

const (
	rulesFile     = "prometheus/alerts.yml"
	ruleTestsFile = "prometheus/alerts_test.yml"
	dashboardFile = "grafana/overage-dashboard.json"
)

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAlertRules runs promtool on the rules and their unit tests, and
// checks that every alert has a test where it fires and one where it
// stays quiet.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool := aptinstall.Command(t, "promtool", "prometheus", "/usr/bin/promtool")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", ruleTestsFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	rules, tests := read(t, rulesFile), read(t, ruleTestsFile)
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\w+)$`).FindAllStringSubmatch(rules, -1)
	if len(alerts) < 8 {
		t.Fatalf("%d alerts in %s", len(alerts), rulesFile)
	}
	for _, a := range alerts {
		name := a[1]
		fires := regexp.MustCompile(`alertname: ` + name + `\n\s+exp_alerts:\n\s+- exp_labels:`)
		quiet := regexp.MustCompile(`alertname: ` + name + `\n\s+exp_alerts: \[\]`)
		if !fires.MatchString(tests) {
			t.Errorf("no unit test in %s where %s fires", ruleTestsFile, name)
		}
		if !quiet.MatchString(tests) {
			t.Errorf("no unit test in %s where %s stays quiet", ruleTestsFile, name)
		}
	}
}

// exported scrapes real /metrics answers: `overage serve`'s (ingest and
// backlog), and a work process's Stripe call metrics after real calls to
// the Stripe emulator, one of them answered 429.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	srv := apitest.Start(t)
	// One usage event, so the ingest histogram has a series.
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/usage-events", strings.NewReader(`{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":1}`))
	req.Header.Set("Authorization", "Bearer "+srv.Tenant(t, "deploy", 0, 0).APIKey)
	req.Header.Set("Idempotency-Key", "deploy-1")
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != http.StatusAccepted {
		t.Fatalf("record a usage event: %v %v", res, err)
	} else {
		res.Body.Close()
	}
	names := map[string]bool{}
	scrape := func(url string) {
		res, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+) (\S+)$`).FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
			if m[2] == "histogram" {
				names[m[1]+"_bucket"], names[m[1]+"_sum"], names[m[1]+"_count"] = true, true, true
			}
		}
	}
	scrape(srv.URL + "/metrics")

	emu := emulator.New(emulator.Options{})
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	sc, err := stripeclient.New(stripeclient.Config{SecretKey: "sk_test_deploy", APIBase: base})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sender := metrics.InstrumentSender(sc, reg)
	alerts.NewMetrics(reg) // what overage work registers beside it
	ev := stripeclient.MeterEvent{EventName: "llm_input_tokens", CustomerID: "cus_deploy", Value: 5, Timestamp: time.Now(), Key: "usage-log:deploy:input"}
	if _, err := sender.SendMeterEvent(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	emu.SetFaults(emulator.Faults{RateLimitRate: 1})
	ev.Key = "usage-log:deploy-429:input"
	if _, err := sender.SendMeterEvent(context.Background(), ev); err == nil {
		t.Fatal("a 429 was not an error")
	}
	ms := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(ms.Close)
	scrape(ms.URL)
	res, err := http.Get(ms.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(b), `overage_stripe_calls_total{outcome="rate_limited"} 1`) {
		t.Fatalf("a 429 is not counted as rate_limited:\n%s", b)
	}
	return names
}

// queried lists the overage metrics an expression text uses.
func queried(text string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`\boverage_[a-z_]+\b`).FindAllString(text, -1) {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// TestDashboardAndAlertsQueryExportedMetrics checks the Grafana dashboard
// is a dashboard, and that every metric it and the alert rules query is
// one the binary exports, so neither watches a name that never comes.
func TestDashboardAndAlertsQueryExportedMetrics(t *testing.T) {
	t.Parallel()
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(read(t, dashboardFile)), &dash); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatalf("%s has no title, uid or panels", dashboardFile)
	}
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	onDashboard := queried(strings.Join(exprs, "\n"))
	inAlerts := queried(read(t, rulesFile))

	names := exported(t)
	for _, m := range append(slices.Clone(onDashboard), inAlerts...) {
		if !names[m] {
			t.Errorf("%s is queried but the binary does not export it", m)
		}
	}
	// The dashboard shows what the alerts watch.
	for _, m := range inAlerts {
		base := strings.TrimSuffix(m, "_bucket")
		if !slices.ContainsFunc(onDashboard, func(d string) bool { return strings.HasPrefix(d, base) }) {
			t.Errorf("alerted on %s, which the dashboard does not show", m)
		}
	}
	if !strings.Contains(strings.Join(exprs, "\n"), `up{job=~"overage-serve|overage-work"}`) {
		t.Error("the dashboard does not show whether the processes are up")
	}
}

// TestReadmeStandsAlone checks that the README links the alerts and the
// dashboard, and that no tracked file points outside the repository (a
// clone has nothing beside it).
func TestReadmeStandsAlone(t *testing.T) {
	t.Parallel()
	readme := read(t, "../README.md")
	for _, f := range []string{rulesFile, ruleTestsFile, dashboardFile} {
		if !strings.Contains(readme, "(deploy/"+f+")") {
			t.Errorf("README.md does not link deploy/%s", f)
		}
	}
	out, err := exec.Command("git", "-C", "..", "ls-files").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	// Spelled in pieces, so this file does not match itself.
	outside := []string{"../" + "shared", "SPEC" + ".md"}
	for _, f := range strings.Fields(string(out)) {
		b, err := os.ReadFile("../" + f)
		if err != nil {
			continue // deleted in the work tree
		}
		for _, o := range outside {
			if strings.Contains(string(b), o) {
				t.Errorf("%s refers to %s, outside the repository", f, o)
			}
		}
	}
}
