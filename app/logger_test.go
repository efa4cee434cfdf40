package app

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

func TestLoggerWritesDurationsAsStrings(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	NewLogger(&buf, slog.LevelInfo).With(slog.Group("job", "timeout", 2*time.Minute)).Info("swept", "took", 1500*time.Millisecond, "count", 3)
	var line struct {
		Took  any `json:"took"`
		Count any `json:"count"`
		Job   struct {
			Timeout any `json:"timeout"`
		} `json:"job"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	if line.Took != "1.5s" || line.Job.Timeout != "2m0s" || line.Count != float64(3) {
		t.Fatalf("took %v, job.timeout %v, count %v: %s", line.Took, line.Job.Timeout, line.Count, buf.String())
	}
}
