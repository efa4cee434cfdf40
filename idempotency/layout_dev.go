//go:build dev

package idempotency

import (
	"fmt"
	"os"
	"time"
)

// DevWidthEnv names the variable by which a development build compresses
// time (bench/expiry.sh): OVERAGE_DEV_IDEMPOTENCY_WIDTH=1m makes
// partitions a minute wide, records kept a minute, the margin and the
// maintenance interval shrunk alike (layout.scaled). Every process of one
// database (migrate, serve, work) must have the same. Read from the
// environment at start, not configured: the production build has no such
// setting at all.
const DevWidthEnv = "OVERAGE_DEV_IDEMPOTENCY_WIDTH"

func buildLayout() layout {
	v := os.Getenv(DevWidthEnv)
	if v == "" {
		return production
	}
	w, err := time.ParseDuration(v)
	if err != nil || w < 10*time.Second || w > production.Width || production.Width%w != 0 {
		// At start, before anything is stored: a width that does not
		// divide a day would make bounds that no day partition meets.
		panic(fmt.Sprintf("%s=%q: want a duration of 10s or more that divides 24h", DevWidthEnv, v))
	}
	return production.scaled(w)
}
