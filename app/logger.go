package app

import (
	"context"
	"log/slog"
	"sync"
)

// logDurations renders a time.Duration as its String ("1.5s"), as people
// and the configuration write it, instead of slog's JSON nanoseconds.
func logDurations(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// closableHandler passes records to next until close, then drops them;
// close waits for a record being written, so none is written after it.
type closableHandler struct {
	next   slog.Handler
	mu     *sync.RWMutex
	closed *bool
}

func newClosableHandler(next slog.Handler) *closableHandler {
	return &closableHandler{next: next, mu: &sync.RWMutex{}, closed: new(bool)}
}

func (h *closableHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *closableHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if *h.closed {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h *closableHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &closableHandler{next: h.next.WithAttrs(as), mu: h.mu, closed: h.closed}
}

func (h *closableHandler) WithGroup(name string) slog.Handler {
	return &closableHandler{next: h.next.WithGroup(name), mu: h.mu, closed: h.closed}
}

func (h *closableHandler) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.closed = true
}
