// Package flakyproxy is an HTTP reverse proxy that misbehaves on purpose:
// it can lose a response after the server has committed the request, or
// answer for the server with 503, 409 in progress or 429. The client tests
// and `overage dev` use it to show that retries with the same
// Idempotency-Key never record an event twice.
package flakyproxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
)

// Fault is what the proxy does to one request.
type Fault string

const (
	// None forwards the request and its answer.
	None Fault = ""
	// DropAfterCommit forwards the request, lets the server finish, then
	// closes the client's connection without an answer: the lost response.
	DropAfterCommit Fault = "drop-after-commit"
	// Unavailable answers 503 with Retry-After: 1 without forwarding.
	Unavailable Fault = "503"
	// InProgress answers 409 idempotency-key-in-progress with Retry-After: 1.
	InProgress Fault = "409-in-progress"
	// TooMany answers 429 with Retry-After: 1.
	TooMany Fault = "429"
)

// Seen is one request that reached the proxy.
type Seen struct {
	Key   string
	Body  string
	Fault Fault
}

// Proxy forwards to a target, applying the fault decide picks per request.
type Proxy struct {
	target *httputil.ReverseProxy
	decide func() Fault

	mu   sync.Mutex
	seen []Seen
}

// New returns a proxy to target. decide is called once per request.
func New(target string, decide func() Fault) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	return &Proxy{target: httputil.NewSingleHostReverseProxy(u), decide: decide}, nil
}

// Script returns a decide function applying faults in order, then None.
func Script(faults ...Fault) func() Fault {
	var mu sync.Mutex
	return func() Fault {
		mu.Lock()
		defer mu.Unlock()
		if len(faults) == 0 {
			return None
		}
		f := faults[0]
		faults = faults[1:]
		return f
	}
}

// Seen returns every request so far, in arrival order.
func (p *Proxy) Seen() []Seen {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Seen(nil), p.seen...)
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	fault := p.decide()
	p.mu.Lock()
	p.seen = append(p.seen, Seen{Key: r.Header.Get("Idempotency-Key"), Body: string(body), Fault: fault})
	p.mu.Unlock()

	problem := func(status int, slug string) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"type":"https://overage.dev/problems/`+slug+`","title":"`+http.StatusText(status)+`","status":`+strconv.Itoa(status)+`,"detail":"injected by flakyproxy"}`)
	}
	switch fault {
	case DropAfterCommit:
		p.target.ServeHTTP(httptest.NewRecorder(), r)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
	case Unavailable:
		problem(http.StatusServiceUnavailable, "service-unavailable")
	case InProgress:
		problem(http.StatusConflict, "idempotency-key-in-progress")
	case TooMany:
		problem(http.StatusTooManyRequests, "rate-limited")
	default:
		p.target.ServeHTTP(w, r)
	}
}
