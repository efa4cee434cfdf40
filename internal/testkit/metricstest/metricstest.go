// Package metricstest reads one series of a running server's Prometheus
// /metrics, for tests that wait on a counter or a gauge.
package metricstest

import (
	"io"
	"net/http"
	"strings"
)

// Value is the value of series (its name with any labels, as the text
// format writes it: `name{label="v"}`) in what url answers, and whether
// the series was there; "" and false when url does not answer.
func Value(c *http.Client, url, series string) (string, bool) {
	res, err := c.Get(url)
	if err != nil {
		return "", false
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v, true
		}
	}
	return "", false
}
