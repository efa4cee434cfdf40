package ingest

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/overage-billing/overage"
)

// The flat arguments of the log insert: each log's keys joined (reused
// while consecutive logs repeat them), its tokens and overage, offset and
// count, whatever the order of logs with other meters or none.
func TestFlatLinesOfMixedLogs(t *testing.T) {
	defaults := []overage.MeterLine{{Meter: "input", Tokens: 1}, {Meter: "output", Tokens: 2}}
	line := func(meter string, n int64) overage.MeterLine {
		// A key of its own backing bytes, as each row's would be.
		return overage.MeterLine{Meter: strings.Clone(meter), Tokens: n, Overage: n * 10}
	}
	logs := [][]overage.MeterLine{
		defaults,
		append(slices.Clone(defaults), line("a", 1), line("b", 2), line("c", 3)),
		append(slices.Clone(defaults), line("a", 4), line("b", 5), line("c", 6)),
		append(slices.Clone(defaults), line("a", 7), line("c", 8)),
		defaults,
		append(slices.Clone(defaults), line("c", 9), line("a", 10)),
		append(slices.Clone(defaults), line("c", 11), line("b", 12)),
	}
	var f flatLines
	for _, l := range logs {
		f.add(l)
	}
	var keys []string
	for _, k := range f.keys {
		if !k.Valid {
			keys = append(keys, "NULL")
			continue
		}
		keys = append(keys, k.String)
	}
	if want := []string{"NULL", "a,b,c", "a,b,c", "a,c", "NULL", "c,a", "c,b"}; !slices.Equal(keys, want) {
		t.Fatalf("keys %q, want %q", keys, want)
	}
	if want := []int32{0, 0, 3, 6, 8, 8, 10}; !slices.Equal(f.offsets, want) {
		t.Fatalf("offsets %v, want %v", f.offsets, want)
	}
	if want := []int32{0, 3, 3, 2, 0, 2, 2}; !slices.Equal(f.count, want) {
		t.Fatalf("counts %v, want %v", f.count, want)
	}
	for i, n := range f.tokens {
		if int64(n) != int64(i+1) || int64(f.over[i]) != 10*int64(i+1) {
			t.Fatalf("line %d: tokens %d, overage %d", i, n, f.over[i])
		}
	}
}

// Lines cut from the transaction's block are each a log's own: filling
// one, or appending past it, never changes another's.
func TestNewLinesDoNotOverlap(t *testing.T) {
	st := &state{}
	var all [][]overage.MeterLine
	for i := range 2000 {
		n := 1 + i%7
		lines := st.newLines(n)
		if len(lines) != 0 || cap(lines) != n {
			t.Fatalf("newLines(%d): len %d cap %d", n, len(lines), cap(lines))
		}
		for j := range n {
			lines = append(lines, overage.MeterLine{Tokens: int64(i), Overage: int64(j)})
		}
		all = append(all, lines)
		_ = append(all[len(all)/2], overage.MeterLine{Tokens: -1}) // past its room: a copy
	}
	for i, lines := range all {
		for j, ln := range lines {
			if ln.Tokens != int64(i) || ln.Overage != int64(j) {
				t.Fatalf("log %d line %d: %+v", i, j, ln)
			}
		}
	}
}

// eventMonths: each calendar month (UTC) once, whatever the order and
// time zone of the timestamps, and their span.
func TestEventMonths(t *testing.T) {
	tz := time.FixedZone("UTC-5", -5*3600)
	ts := []time.Time{
		time.Date(2026, 11, 30, 20, 0, 0, 0, tz), // 1 December in UTC
		time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 30, 23, 59, 59, 999999000, time.UTC),
		time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC),
	}
	events := make([]*Event, len(ts))
	for i, x := range ts {
		events[i] = &Event{Timestamp: x}
	}
	months, lo, hi := eventMonths(events)
	var got []time.Time
	for _, m := range months {
		got = append(got, time.Time(m))
	}
	want := []time.Time{time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)}
	if !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Fatalf("months %v, want %v", got, want)
	}
	if !lo.Equal(ts[4]) || !hi.Equal(ts[2]) {
		t.Fatalf("span %v to %v, want %v to %v", lo, hi, ts[4], ts[2])
	}
}
