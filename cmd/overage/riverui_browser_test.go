package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/overage-billing/overage/internal/httpx"
	"github.com/overage-billing/overage/internal/pgtest"
	"github.com/overage-billing/overage/internal/poll"
	"github.com/overage-billing/overage/internal/testkit/aptinstall"
)

// TestRiverUIOpensInABrowser signs in to River UI in a real headless
// Chromium as an operator would: the login page, a wrong token refused, the
// admin token accepted, a Secure, HttpOnly, SameSite cookie, and River UI's
// own pages and JSON API working behind it.
func TestRiverUIOpensInABrowser(t *testing.T) {
	t.Parallel()
	browser := aptinstall.Command(t, "chromium", "chromium")
	dbURL := pgtest.NewDatabase(t)
	const adminToken = "admin-browser-token-1234-0123456789abcdef"
	env := map[string]string{"DATABASE_URL": dbURL, "LISTEN_ADDR": "127.0.0.1:0", "ADMIN_TOKEN": adminToken}
	// A job for River UI to show: the report of one recorded event.
	out, _, err := runCmd(t, env, "tenant", "create", "--name", "Acme", "--stripe-customer", "cus_browser")
	if err != nil {
		t.Fatal(err)
	}
	srv, logs := startServer(t, env)
	base := "http://" + srv.Addr()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/usage-events", strings.NewReader(`{"user_id":"u","model_id":"m","input_tokens":10,"output_tokens":1}`))
	req.Header.Set("Authorization", "Bearer "+mustField(t, out, "api_key"))
	req.Header.Set("Idempotency-Key", "browser-1")
	if res, err := httpClient.Do(req); err != nil || res.StatusCode != http.StatusAccepted {
		t.Fatalf("record an event: %v %v", res, err)
	} else {
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}

	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(browser), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()))
	defer cancelAlloc()
	ctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	// The first Run starts the browser and must not carry a timeout.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()

	// Not signed in: River UI sends the browser to the login page.
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/riverui/"), chromedp.WaitVisible(chromedp.CSS("#token"))); err != nil {
		t.Fatalf("open /riverui/: %v", err)
	}
	if loc, err := chromedp.Run(ctx, chromedp.Location()); err != nil || loc != base+"/riverui/login" {
		t.Fatalf("not signed in, the browser is at %q (%v), want the login page", loc, err)
	}
	// A wrong token is refused and sets no cookie.
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#token"), "not-the-token"), chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("#error"))); err != nil {
		t.Fatalf("sign in with a wrong token: %v", err)
	}
	if c := sessionCookie(t, ctx, base); c != nil {
		t.Fatalf("a wrong token got a session cookie: %+v", c)
	}

	// The admin token signs in, and River UI lists the report job through
	// its JSON API.
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#token"), adminToken), chromedp.Click(chromedp.CSS("#signin"))); err != nil {
		t.Fatalf("sign in: %v", err)
	}
	// Evaluated again and again: the page navigates under the script.
	shows := func(js string) func() bool {
		return func() bool {
			ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
			return err == nil && ok
		}
	}
	poll.Until(t, "River UI after signing in", 30*time.Second,
		shows(`document.readyState === "complete" && location.pathname.startsWith("/riverui/") && location.pathname !== "/riverui/login"`))
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/riverui/jobs?state=available")); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "River UI to list the report job", 30*time.Second, shows(`document.body.innerText.includes("overage.report_tenant")`))
	c := sessionCookie(t, ctx, base)
	if c == nil || !c.Secure || !c.HTTPOnly || c.SameSite != network.CookieSameSiteStrict || c.Path != "/riverui" || strings.Contains(c.Value, adminToken) {
		t.Fatalf("session cookie %+v: want Secure, HttpOnly, SameSite=Strict, Path=/riverui, without the token", c)
	}
	if seen, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.cookie`)); err != nil || strings.Contains(seen, httpx.SessionCookie) {
		t.Fatalf("page scripts can read the session cookie: %q %v", seen, err)
	}
	if !strings.Contains(logs.String(), `"path":"/riverui/api/jobs","status":200`) {
		t.Fatal("River UI's JSON API did not answer the signed-in browser")
	}
	if strings.Contains(logs.String(), adminToken) {
		t.Fatal("the admin token reached the log")
	}
}

func sessionCookie(t *testing.T, ctx context.Context, base string) *network.Cookie {
	t.Helper()
	res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{base + "/riverui/"}})
	if err != nil {
		t.Fatalf("read cookies: %v", err)
	}
	for _, c := range res.Cookies {
		if c.Name == httpx.SessionCookie {
			return c
		}
	}
	return nil
}

func mustField(t *testing.T, jsonText, field string) string {
	t.Helper()
	var m map[string]any
	if err := jsonUnmarshal(jsonText, &m); err != nil {
		t.Fatalf("%q: %v", jsonText, err)
	}
	v, _ := m[field].(string)
	if v == "" {
		t.Fatalf("no %s in %s", field, jsonText)
	}
	return v
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }
