package httpx

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"html/template"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/overage-billing/overage"
)

// SessionCookie is the cookie of a browser signed in to the operator
// pages (River UI).
const SessionCookie = "overage_admin_session"

// SessionTTL is how long a browser stays signed in.
const SessionTTL = 12 * time.Hour

// AdminBrowser guards pages a person opens in a browser, mounted at
// prefix (River UI at /riverui). It admits the admin token as a bearer
// token, as AdminOnly does, or a session cookie that prefix+"/login" sets
// once the token is typed in. A browser that is not signed in is sent to
// the login page; any other caller gets 401.
//
// The cookie is Secure, HttpOnly and SameSite=Strict, and holds no token:
// it is an expiry signed with HMAC-SHA256 under the admin token, so
// changing ADMIN_TOKEN signs every browser out. Browsers keep Secure
// cookies only over HTTPS, or over plain HTTP on loopback (the demo).
func AdminBrowser(adminToken, prefix string, logger *slog.Logger) func(http.Handler) http.Handler {
	login := prefix + "/login"
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == login {
				serveLogin(w, r, adminToken, prefix, logger)
				return
			}
			if IsAdmin(r, adminToken) || validSession(r, adminToken, time.Now()) {
				next.ServeHTTP(w, r)
				return
			}
			if (r.Method == http.MethodGet || r.Method == http.MethodHead) && strings.Contains(r.Header.Get("Accept"), "text/html") {
				http.Redirect(w, r, login, http.StatusSeeOther)
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="overage-admin"`)
			refuseAdmin(w, r, logger, adminToken, "send the admin token (ADMIN_TOKEN) as Authorization: Bearer <token>, or sign in at "+login)
		})
	}
}

// loginPage is the sign-in page. Its stylesheet is inline and it loads
// nothing else — no fonts, images or scripts from anywhere — so it looks
// the same offline, behind a strict proxy and on a loopback demo (the
// icon is a data: URL, so the browser does not ask for /favicon.ico). The
// heading does not wrap (TestRiverUIOpensInABrowser measures it).
var loginPage = template.Must(template.New("login").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in · overage</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'%3E%3Crect width='16' height='16' rx='4' fill='%233451c7'/%3E%3C/svg%3E">
<style>
:root { --ink: #172033; --muted: #5a6478; --line: #d5dbe7; --accent: #3451c7; --accent-dark: #263f9e; }
* { box-sizing: border-box; }
html, body { height: 100%; }
body { margin: 0; display: flex; align-items: center; justify-content: center; padding: 24px;
  font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
  color: var(--ink); background: #eef1f8 linear-gradient(160deg, #e3e9fb 0%, #f3f5fa 50%, #e6ebf4 100%); }
main { width: 100%; max-width: 400px; background: #fff; border: 1px solid var(--line); border-radius: 14px;
  box-shadow: 0 12px 32px rgba(23, 32, 51, .10); padding: 32px 32px 28px; }
.brand { display: flex; align-items: center; gap: 10px; margin: 0 0 24px; font-weight: 650; font-size: 15px; }
.mark { width: 28px; height: 28px; border-radius: 8px; background: var(--accent); color: #fff;
  display: flex; align-items: center; justify-content: center; font-size: 16px; line-height: 1; }
h1 { margin: 0 0 4px; font-size: 24px; line-height: 1.25; font-weight: 650; white-space: nowrap; }
.lead { margin: 0 0 24px; color: var(--muted); font-size: 14px; }
label { display: block; margin: 0 0 6px; font-size: 14px; font-weight: 600; }
input { display: block; width: 100%; padding: 10px 12px; font: inherit; color: inherit;
  border: 1px solid var(--line); border-radius: 8px; background: #fbfcfe; }
input:focus { outline: 3px solid rgba(52, 81, 199, .25); border-color: var(--accent); background: #fff; }
.hint { margin: 6px 0 20px; color: var(--muted); font-size: 13px; }
button { display: block; width: 100%; padding: 10px 14px; font: inherit; font-weight: 600; color: #fff;
  background: var(--accent); border: 0; border-radius: 8px; cursor: pointer; }
button:hover, button:focus-visible { background: var(--accent-dark); }
.error { margin: 0 0 18px; padding: 10px 12px; font-size: 14px; color: #9b1c1c;
  background: #fdf0f0; border: 1px solid #f3c4c4; border-radius: 8px; }
code { font: 13px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
</style></head>
<body><main>
<div class="brand"><span class="mark" aria-hidden="true">o</span>overage</div>
<h1>Sign in</h1>
<p class="lead">to River UI, the billing job queue</p>
{{if .Failed}}<p id="error" class="error" role="alert">That is not the admin token.</p>{{end}}
{{if .Disabled}}<p id="error" class="error" role="alert">ADMIN_TOKEN is not configured: operator pages are disabled.</p>{{end}}
<form method="post" action="{{.Action}}">
<label for="token">Admin token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>
<p class="hint">The server's <code>ADMIN_TOKEN</code>. You stay signed in for {{.Hours}} hours.</p>
<button id="signin" type="submit">Sign in</button>
</form>
</main></body></html>
`))

func serveLogin(w http.ResponseWriter, r *http.Request, adminToken, prefix string, logger *slog.Logger) {
	page := struct {
		Action           string
		Failed, Disabled bool
		Hours            int
	}{Action: prefix + "/login", Disabled: adminToken == "", Hours: int(SessionTTL.Hours())}
	status := http.StatusOK
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodPost:
		r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
		if sameToken(r.PostFormValue("token"), adminToken) {
			http.SetCookie(w, &http.Cookie{
				Name: SessionCookie, Value: newSession(adminToken, time.Now().Add(SessionTTL)),
				Path: prefix, MaxAge: int(SessionTTL.Seconds()),
				Secure: true, HttpOnly: true, SameSite: http.SameSiteStrictMode,
			})
			http.Redirect(w, r, prefix+"/", http.StatusSeeOther)
			return
		}
		page.Failed, status = !page.Disabled, http.StatusUnauthorized
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		Error(w, r, logger, methodNotAllowed(r))
		return
	}
	var b strings.Builder
	if err := loginPage.Execute(&b, page); err != nil {
		Error(w, r, logger, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	Write(w, "text/html; charset=utf-8", status, []byte(b.String()))
}

// newSession is a session value: its expiry and the expiry's MAC.
func newSession(adminToken string, expires time.Time) string {
	exp := strconv.FormatInt(expires.Unix(), 10)
	return exp + "." + base64.RawURLEncoding.EncodeToString(sessionMAC(adminToken, exp))
}

func sessionMAC(adminToken, exp string) []byte {
	m := hmac.New(sha256.New, []byte(adminToken))
	m.Write([]byte("overage admin session\x00" + exp))
	return m.Sum(nil)
}

func validSession(r *http.Request, adminToken string, now time.Time) bool {
	c, err := r.Cookie(SessionCookie)
	if err != nil || adminToken == "" {
		return false
	}
	exp, mac, ok := strings.Cut(c.Value, ".")
	if !ok {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(mac)
	if err != nil || !hmac.Equal(got, sessionMAC(adminToken, exp)) {
		return false
	}
	secs, err := strconv.ParseInt(exp, 10, 64)
	return err == nil && now.Before(time.Unix(secs, 0))
}

func methodNotAllowed(r *http.Request) error {
	return overage.Errorf(overage.EMETHOD, "method-not-allowed", "%s is not allowed on %s", r.Method, r.URL.Path)
}
