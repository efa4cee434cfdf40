package app

import (
	"log/slog"
)

// logDurations renders a time.Duration as its String ("1.5s"), as people
// and the configuration write it, instead of slog's JSON nanoseconds.
func logDurations(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}
