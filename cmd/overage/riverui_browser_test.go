package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	imagepng "image/png"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/overage-billing/overage/internal/httpx"
	"github.com/overage-billing/overage/internal/testkit/aptinstall"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
)

// TestRiverUIOpensInABrowser signs in to River UI in a real headless
// Chromium as an operator would: the login page (screenshots at desktop
// and phone widths measured by checkSignInPage), a wrong token refused, the
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
	shots := screenshotDir(t)
	checkSignInPage(t, ctx, shots, "signin-desktop", 1280, 800)
	checkSignInPage(t, ctx, shots, "signin-phone", 390, 844)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatal(err)
	}
	// A wrong token is refused and sets no cookie.
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#token"), "not-the-token"), chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("#error"))); err != nil {
		t.Fatalf("sign in with a wrong token: %v", err)
	}
	checkSignInPage(t, ctx, shots, "signin-wrong-token", 1280, 800)
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
	polltest.Until(t, "River UI after signing in", 30*time.Second,
		shows(`document.readyState === "complete" && location.pathname.startsWith("/riverui/") && location.pathname !== "/riverui/login"`))
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/riverui/jobs?state=available")); err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, "River UI to list the report job", 30*time.Second, shows(`document.body.innerText.includes("overage.report_tenant")`))
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

// screenshotDir is where the browser test saves its screenshots: the
// test's temporary directory, or SCREENSHOT_DIR to keep them for a look.
func screenshotDir(t *testing.T) string {
	if d := os.Getenv("SCREENSHOT_DIR"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// signInLayout is what checkSignInPage measures of the sign-in page.
type signInLayout struct {
	HeadingHeight, HeadingLineHeight   float64
	CardLeft, CardRight, CardTop       float64
	CardBottom, ViewWidth, ViewHeight  float64
	ScrollWidth                        float64
	Resources                          int
	ResourceNames                      string
	Sheets, InlineSheets               int
	InputWidth, ButtonWidth, CardWidth float64
	ButtonColor, FontFamily            string
}

// checkSignInPage sizes the browser to width×height, takes a screenshot
// of the sign-in page it shows into dir/name.png, and fails t unless the
// page looks like a product's: the heading on one line, the card with the
// form centred and inside the window, the field and button as wide as
// the card's content, a coloured button, a background that is not plain
// white (read off the screenshot), a sans-serif font, and nothing loaded
// but the page itself (its one stylesheet inline).
func checkSignInPage(t *testing.T, ctx context.Context, dir, name string, width, height int64) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, height), chromedp.WaitVisible(chromedp.CSS("#token"))); err != nil {
		t.Fatalf("%s: size the window: %v", name, err)
	}
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("%s: screenshot: %v", name, err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %s", name, path)
	l, err := chromedp.Run(ctx, chromedp.Evaluate[signInLayout](`(() => {
		const h = document.querySelector("h1"), card = document.querySelector("main") || document.querySelector("form"), hb = h.getBoundingClientRect(), cb = card.getBoundingClientRect();
		const cs = getComputedStyle(card), inner = cb.width - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight) - parseFloat(cs.borderLeftWidth) - parseFloat(cs.borderRightWidth);
		return {
			HeadingHeight: hb.height, HeadingLineHeight: parseFloat(getComputedStyle(h).lineHeight) || 1.2 * parseFloat(getComputedStyle(h).fontSize), // "normal" is about 1.2
			CardLeft: cb.left, CardRight: window.innerWidth - cb.right, CardTop: cb.top, CardBottom: window.innerHeight - cb.bottom,
			ViewWidth: window.innerWidth, ViewHeight: window.innerHeight, ScrollWidth: document.documentElement.scrollWidth,
			Resources: performance.getEntriesByType("resource").length, ResourceNames: performance.getEntriesByType("resource").map(e => e.name).join(" "),
			Sheets: document.styleSheets.length, InlineSheets: [...document.styleSheets].filter(s => !s.href).length,
			InputWidth: document.querySelector("#token").getBoundingClientRect().width,
			ButtonWidth: document.querySelector("#signin").getBoundingClientRect().width, CardWidth: inner,
			ButtonColor: getComputedStyle(document.querySelector("#signin")).backgroundColor,
			FontFamily: getComputedStyle(document.body).fontFamily,
		};
	})()`))
	if err != nil {
		t.Fatalf("%s: measure the page: %v", name, err)
	}
	if l.HeadingHeight <= 0 || l.HeadingHeight >= 1.5*l.HeadingLineHeight {
		t.Errorf("%s: the heading is %.0f px high at a line height of %.0f px: it wraps (%s)", name, l.HeadingHeight, l.HeadingLineHeight, path)
	}
	if math.Abs(l.CardLeft-l.CardRight) > 2 || l.CardLeft < 0 || l.CardTop < 0 || l.CardBottom < 0 || l.ScrollWidth > l.ViewWidth {
		t.Errorf("%s: the card is not centred inside the window: %.0f px left, %.0f px right, %.0f px above, %.0f px below, page %.0f px wide in %.0f (%s)",
			name, l.CardLeft, l.CardRight, l.CardTop, l.CardBottom, l.ScrollWidth, l.ViewWidth, path)
	}
	if l.ViewHeight > 600 && math.Abs(l.CardTop-l.CardBottom) > 2 {
		t.Errorf("%s: the card is not centred vertically: %.0f px above, %.0f px below (%s)", name, l.CardTop, l.CardBottom, path)
	}
	if math.Abs(l.InputWidth-l.CardWidth) > 1 || math.Abs(l.ButtonWidth-l.CardWidth) > 1 {
		t.Errorf("%s: the field (%.0f px) and button (%.0f px) do not span the card's %.0f px (%s)", name, l.InputWidth, l.ButtonWidth, l.CardWidth, path)
	}
	if l.ButtonColor == "" || strings.Contains(l.ButtonColor, "rgba(0, 0, 0, 0)") || l.ButtonColor == "rgb(239, 239, 239)" || l.ButtonColor == "rgb(255, 255, 255)" {
		t.Errorf("%s: the button is the browser's default (%s) (%s)", name, l.ButtonColor, path)
	}
	if strings.HasPrefix(l.FontFamily, "\"Times") || l.FontFamily == "serif" || !strings.Contains(l.FontFamily, "sans-serif") {
		t.Errorf("%s: the page is in the browser's default font (%s)", name, l.FontFamily)
	}
	if l.Resources != 0 || l.Sheets != 1 || l.InlineSheets != 1 {
		t.Errorf("%s: resources loaded besides the page: %d; stylesheets: %d, inline: %d; want none loaded and one inline (%s)", name, l.Resources, l.Sheets, l.InlineSheets, l.ResourceNames)
	}
	img, err := pngDecode(png)
	if err != nil {
		t.Fatal(err)
	}
	// Beside the card: the page's background, as the screenshot shows it.
	r, g, b, _ := img.At(img.Bounds().Min.X+4, img.Bounds().Min.Y+4).RGBA()
	if r>>8 >= 250 && g>>8 >= 250 && b>>8 >= 250 {
		t.Errorf("%s: the background is plain white (%d, %d, %d) (%s)", name, r>>8, g>>8, b>>8, path)
	}
}

func pngDecode(b []byte) (image.Image, error) { return imagepng.Decode(bytes.NewReader(b)) }

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
