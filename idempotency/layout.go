package idempotency

import "time"

// layout is the time shape of the records and their partitions. Production
// has one, production: a record kept a day, partitions a UTC day wide, a
// week of them ahead, one dropped an hour after its last record expired,
// kept every ten minutes. The development build can compress it
// (layout_dev.go) so that partitions fill, expire and go within a
// benchmark's minutes; the code and SQL are the same, parameterised by
// the width.
type layout struct {
	// Width is the span of expiry times of one partition; it divides a
	// day, so the partitions' bounds fall on UTC days as well.
	Width time.Duration
	// TTL is how long a stored answer is kept and replayed.
	TTL time.Duration
	// Ahead is how many partitions beyond the current one are kept ready.
	Ahead int
	// DropMargin is how long after its last record expired a partition is
	// kept.
	DropMargin time.Duration
	// MaintainEvery is how often `overage work` runs Maintain.
	MaintainEvery time.Duration
}

// production is the layout of the production build, and of the
// development build unless it is told otherwise.
var production = layout{Width: 24 * time.Hour, TTL: 24 * time.Hour, Ahead: 7, DropMargin: time.Hour, MaintainEvery: 10 * time.Minute}

// lay is this process's layout, fixed at start.
var lay = buildLayout()

// scaled is l with time compressed so that a partition is width wide:
// every duration shrinks by the same factor, with floors where a duration
// bounds something that does not shrink with it (an ingest transaction's
// length for DropMargin, a River job's start for MaintainEvery).
func (l layout) scaled(width time.Duration) layout {
	f := float64(width) / float64(l.Width)
	s := func(d, floor time.Duration) time.Duration { return max(time.Duration(float64(d)*f), floor) }
	return layout{Width: width, TTL: s(l.TTL, 0), Ahead: l.Ahead, DropMargin: s(l.DropMargin, 5*time.Second), MaintainEvery: s(l.MaintainEvery, time.Second)}
}

// name is the name of the partition whose records expire from lower: the
// UTC day (idempotency_keys_20261201), and the time of day for partitions
// narrower than a day (idempotency_keys_20261201_215600).
func (l layout) name(lower time.Time) string {
	if l.Width%(24*time.Hour) == 0 {
		return "idempotency_keys_" + lower.UTC().Format("20060102")
	}
	return "idempotency_keys_" + lower.UTC().Format("20060102_150405")
}

// leftoverPattern matches the names of every layout's partitions and the
// legacy one, for the detached leftovers DropExpired finds.
const leftoverPattern = `^idempotency_keys_([0-9]{8}(_[0-9]{6})?|legacy)$`

// TTL is how long a stored answer is kept and replayed: 24 hours.
var TTL = lay.TTL

// Width is the span of expiry times of one partition: a UTC day.
var Width = lay.Width

// Ahead is how many partitions (UTC days) beyond the current one are kept
// ready, so ingest goes on for a week should no `overage work` run.
var Ahead = lay.Ahead

// DropMargin is how long after its last record expired a partition is
// kept: an ingest transaction that began before the expiry (and so still
// counts such a record live) has long finished by then — it is bounded by
// seconds.
var DropMargin = lay.DropMargin

// MaintainEvery is how often `overage work` runs Maintain (its
// REAP_INTERVAL): ten minutes, so a partition goes at most that long after
// DropMargin has passed.
var MaintainEvery = lay.MaintainEvery
