package ingest

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
)

// benchBatchBody is a batch of n events as the ingest bench sends them.
func benchBatchBody(n int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"events":[`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"request_id":"req-%d","user_id":"user-%d","model_id":"gpt-4o","input_tokens":%d,"output_tokens":%d,"timestamp":"2026-11-30T10:00:00.123456Z"}`, i, i%7, 100+i, 50+i)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}

// benchResults are the results newLogs would give events: every log new,
// half of them with overage.
func benchResults(tenant uuid.UUID, events []*Event, now time.Time) []result {
	results := make([]result, len(events))
	for i, ev := range events {
		l := &overage.UsageLog{
			ID: uuid.Must(uuid.NewV7()), TenantID: tenant, RequestID: ev.RequestID, Timestamp: ev.Timestamp,
			UserID: ev.UserID, ModelID: ev.ModelID, InputTokens: ev.InputTokens, OutputTokens: ev.OutputTokens,
			BillingStatus: overage.BillingStatusNotBillable, CreatedAt: now, Kind: overage.KindUsage,
		}
		if i%2 == 1 {
			l.Overage = overage.Overage{InputTokens: ev.InputTokens, OutputTokens: ev.OutputTokens / 2}
			l.BillingStatus = overage.BillingStatusPending
		}
		l.StripeEvents = meterEvents(l.Overage, [2]*uuid.UUID{}, [2]*time.Time{})
		results[i] = result{log: l}
	}
	return results
}

// BenchmarkBatchServeCPU is what serve's own code does with a 1,000-event
// batch besides the database: parse, fingerprint, render the answer.
func BenchmarkBatchServeCPU(b *testing.B) {
	body := benchBatchBody(MaxBatchEvents)
	now := time.Date(2026, 11, 30, 10, 1, 0, 0, time.UTC)
	tenant := uuid.New()
	events, err := parseBatch(body, now, tenant)
	if err != nil {
		b.Fatal(err)
	}
	results := benchResults(tenant, events, now)
	b.Run("parse", func(b *testing.B) {
		for b.Loop() {
			if _, err := parseBatch(body, now, tenant); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fingerprint", func(b *testing.B) {
		for b.Loop() {
			if _, err := fingerprint("POST", "/v1/usage-events/batch", body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("render", func(b *testing.B) {
		for b.Loop() {
			if _, err := renderBatch(results); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("all", func(b *testing.B) {
		for b.Loop() {
			if _, err := parseBatch(body, now, tenant); err != nil {
				b.Fatal(err)
			}
			if _, err := fingerprint("POST", "/v1/usage-events/batch", body); err != nil {
				b.Fatal(err)
			}
			if _, err := renderBatch(results); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkNewLogs is the usage logs of a 1,000-event batch, half of them
// with overage, as the transaction builds them between its reads and its
// writes.
func BenchmarkNewLogs(b *testing.B) {
	now := time.Date(2026, 11, 30, 10, 1, 0, 0, time.UTC)
	tenant := uuid.New()
	events, err := parseBatch(benchBatchBody(MaxBatchEvents), now, tenant)
	if err != nil {
		b.Fatal(err)
	}
	period := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	g := &group{tenantID: tenant, events: events}
	fresh := make([]int, len(events))
	for i := range fresh {
		fresh[i] = i
	}
	results := make([]result, len(events))
	for b.Loop() {
		st := &state{now: now, periods: make([]time.Time, len(events)),
			allowance: overage.Overage{InputTokens: 250_000, OutputTokens: 100_000},
			totals:    map[time.Time]*overage.Overage{period: {}}}
		for i := range st.periods {
			st.periods[i] = period
		}
		if _, err := st.newLogs(g, fresh, results); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBatchMeters is serve's own work for a 1,000-event batch of the
// meters benchmark (gpt-4o, 1,200 input tokens of which 800 cache reads,
// 350 output) between the transaction's reads and its writes, and the
// answer: with the default meters only, and with three meters of the model.
func BenchmarkBatchMeters(b *testing.B) {
	now := time.Date(2026, 11, 30, 10, 1, 0, 0, time.UTC)
	tenant := uuid.New()
	var sb strings.Builder
	sb.WriteString(`{"events":[`)
	for i := range MaxBatchEvents {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"request_id":"req-%d","user_id":"user-%d","model_id":"gpt-4o","input_tokens":1200,"cache_read_input_tokens":800,"output_tokens":350,"timestamp":"2026-11-30T10:00:00.123456Z"}`, i, i%7)
	}
	sb.WriteString(`]}`)
	events, err := parseBatch([]byte(sb.String()), now, tenant)
	if err != nil {
		b.Fatal(err)
	}
	period := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	g := &group{tenantID: tenant, events: events}
	fresh := make([]int, len(events))
	for i := range fresh {
		fresh[i] = i
	}
	defaults := []overage.Meter{{Key: "input", TokenType: overage.TokenInput, Models: []string{"*"}},
		{Key: "output", TokenType: overage.TokenOutput, Models: []string{"*"}}}
	catalog := append(defaults[:2:2],
		overage.Meter{Key: "m_input", EventName: "m_input_tokens", TokenType: overage.TokenInput, Models: []string{"gpt-4o"}},
		overage.Meter{Key: "m_cache", EventName: "m_cache_read_tokens", TokenType: overage.TokenCacheRead, Models: []string{"gpt-4o"}},
		overage.Meter{Key: "m_output", EventName: "m_output_tokens", TokenType: overage.TokenOutput, Models: []string{"gpt-4o"}})
	for _, c := range []struct {
		name   string
		meters []overage.Meter
	}{{"defaults", defaults}, {"catalog", catalog}} {
		cat := overage.NewCatalog(1, c.meters)
		b.Run(c.name, func(b *testing.B) {
			results := make([]result, len(events))
			cpu0 := processCPU()
			for b.Loop() {
				st := &state{now: now, periods: make([]time.Time, len(events)), catalog: cat,
					allowance: overage.Overage{InputTokens: 250_000}, included: map[string]int64{},
					totals: map[time.Time]*overage.Overage{period: {}}, extra: extraTotals{}, extraRead: true}
				for i := range st.periods {
					st.periods[i] = period
				}
				w, err := st.newLogs(g, fresh, results)
				if err != nil {
					b.Fatal(err)
				}
				flat := newFlatLines(w.lines)
				for i := range w.logs {
					flat.add(w.lines[i])
				}
				out, err := renderBatch(results)
				if err != nil {
					b.Fatal(err)
				}
				out.release() // as the handler does once it wrote the answer
			}
			// The process's CPU (GC included), steadier than the wall
			// clock on a shared machine.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N*len(events)), "cpu-ns/event")
		})
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
