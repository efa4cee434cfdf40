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

var loginPage = template.Must(template.New("login").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>overage — sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body style="font-family: sans-serif; max-width: 28em; margin: 4em auto">
<h1>overage operator sign-in</h1>
{{if .Failed}}<p id="error" role="alert" style="color: #b00">That is not the admin token.</p>{{end}}
{{if .Disabled}}<p id="error" role="alert" style="color: #b00">ADMIN_TOKEN is not configured: operator pages are disabled.</p>{{end}}
<form method="post" action="{{.Action}}">
<label for="token">Admin token (ADMIN_TOKEN)</label><br>
<input id="token" name="token" type="password" autocomplete="current-password" required autofocus size="40">
<button id="signin" type="submit">Sign in</button>
</form></body></html>
`))

func serveLogin(w http.ResponseWriter, r *http.Request, adminToken, prefix string, logger *slog.Logger) {
	page := struct {
		Action           string
		Failed, Disabled bool
	}{Action: prefix + "/login", Disabled: adminToken == ""}
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
