package stripeclient

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// redacted replaces the secret key wherever it might surface in text.
const redacted = "[REDACTED]"

// slogLeveled adapts slog to stripe-go's LeveledLoggerInterface. stripe-go
// does not log the key today, but it logs response bodies at debug level and
// errors it did not write; scrubbing here keeps the promise whatever a future
// stripe-go or server message contains.
type slogLeveled struct {
	log    *slog.Logger
	secret string
}

func (l slogLeveled) emit(level slog.Level, format string, v ...any) {
	ctx := context.Background()
	if !l.log.Enabled(ctx, level) {
		return
	}
	msg := scrub(fmt.Sprintf(format, v...), l.secret)
	l.log.Log(ctx, level, msg, slog.String("component", "stripe-go"))
}

// stripe-go logs every request at info and every non-2xx at error; the
// caller logs outcomes it acts on, so these are demoted to keep logs useful.
func (l slogLeveled) Debugf(format string, v ...any) { l.emit(slog.LevelDebug, format, v...) }
func (l slogLeveled) Infof(format string, v ...any)  { l.emit(slog.LevelDebug, format, v...) }
func (l slogLeveled) Warnf(format string, v ...any)  { l.emit(slog.LevelWarn, format, v...) }
func (l slogLeveled) Errorf(format string, v ...any) { l.emit(slog.LevelWarn, format, v...) }

func scrub(s, secret string) string {
	if secret == "" {
		return s
	}
	return strings.ReplaceAll(s, secret, redacted)
}
