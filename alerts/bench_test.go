package alerts_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage/alerts"
	"github.com/overage-billing/overage/ingest"
)

// BenchmarkIngestThresholds compares ingest of single events by 16
// clients over 8 tenants with thresholds (50, 80, 100; never reached)
// against the same without, each tenant with allowance left, so every
// transaction is a crossing candidate: the path where Record looks at the
// thresholds. The two run in the same database in halves of 3 s in the
// order A B B A, so drift cancels out of the ratio it reports:
//
//	go test -run '^$' -bench IngestThresholds -benchtime 1x ./alerts
func BenchmarkIngestThresholds(b *testing.B) {
	none := newBenchWorld(b, nil)
	with := none.sameDatabase(b, []int{50, 80, 100})
	rates := map[string]float64{}
	for _, w := range []*benchWorld{none, with, with, none} {
		rates[w.name] += w.drive(b, 16, 3*time.Second) / 2
	}
	b.ReportMetric(rates["none"], "events/s-without")
	b.ReportMetric(rates["thresholds"], "events/s-with")
	b.ReportMetric(rates["thresholds"]/rates["none"], "ratio")
}

type benchWorld struct {
	*world
	name    string
	tenants []uuid.UUID
}

func newBenchWorld(b *testing.B, at []int) *benchWorld {
	b.Helper()
	w := newWorldTB(b, worldOpts{in: 1 << 60, out: 1 << 60, alertAt: at})
	bw := &benchWorld{world: w, name: "none", tenants: []uuid.UUID{w.tenant}}
	for range 7 {
		bw.tenants = append(bw.tenants, w.anotherTB(b, worldOpts{in: 1 << 60, out: 1 << 60, alertAt: at}).tenant)
	}
	return bw
}

func (bw *benchWorld) sameDatabase(b *testing.B, at []int) *benchWorld {
	b.Helper()
	w := bw.anotherTB(b, worldOpts{in: 1 << 60, out: 1 << 60, alertAt: at})
	out := &benchWorld{world: w, name: "thresholds", tenants: []uuid.UUID{w.tenant}}
	for range 7 {
		out.tenants = append(out.tenants, w.anotherTB(b, worldOpts{in: 1 << 60, out: 1 << 60, alertAt: at}).tenant)
	}
	return out
}

// drive records events from clients goroutines for d and returns events/s.
func (bw *benchWorld) drive(b *testing.B, clients int, d time.Duration) float64 {
	var n atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; time.Now().Before(deadline); i++ {
				key := uuid.NewString()
				if _, err := bw.svc.Record(context.Background(), ingest.RecordParams{TenantID: bw.tenants[i%len(bw.tenants)], Key: key, Fingerprint: []byte(key),
					Event: &ingest.Event{Timestamp: time.Now().UTC().Truncate(time.Microsecond), UserID: "u", ModelID: "m", InputTokens: 10, OutputTokens: 1}}); err != nil {
					b.Error(err)
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	return float64(n.Load()) / d.Seconds()
}

// BenchmarkUsage reads GET /v1/usage's answer (ReadUsage) for a tenant
// with usage spread over every ingest slot and billing status, and
// reports its p50 and p99. Its cost does not grow with the number of
// usage logs: it reads counters (at most 65 allowance rows and 5 × 66
// period counter rows a period), never the logs.
func BenchmarkUsage(b *testing.B) {
	w := newWorldTB(b, worldOpts{in: 1000, out: 1000})
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if err := w.batch(context.Background(), 20, 7, 3); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if _, err := w.pool.Exec(context.Background(), `UPDATE usage_logs SET billing_status = 'billed' WHERE id IN (SELECT id FROM usage_logs WHERE billing_status = 'pending' LIMIT 5000)`); err != nil {
		b.Fatal(err)
	}
	// USAGE_BENCH_LOGS=10000000 adds that many billed logs (of this tenant
	// and 99 others, this period and the last twelve), a million a
	// statement, through the counters' triggers, as ingest and billing
	// would have left them: the read must not grow with them.
	if n, _ := strconv.Atoi(os.Getenv("USAGE_BENCH_LOGS")); n > 0 {
		others := []uuid.UUID{w.tenant}
		for range 99 {
			others = append(others, w.anotherTB(b, worldOpts{in: 1000, out: 1000}).tenant)
		}
		for done := 0; done < n; done += 1_000_000 {
			if _, err := w.pool.Exec(context.Background(), `INSERT INTO usage_logs (id, tenant_id, ts, user_id, model_id, input_tokens, output_tokens,
					period_start, overage_input_tokens, overage_output_tokens, billing_status, billed_at)
				SELECT uuidv7(), ($1::uuid[])[1 + g % 100], now() - make_interval(days => (g % 365)::int), 'u', 'm', 10, 5,
					date_trunc('month', now() - make_interval(days => (g % 365)::int), 'UTC'), 10, 5, 'billed', now()
				FROM generate_series($2::bigint, $3::bigint) AS g`, others, done, min(done+1_000_000, n)-1); err != nil {
				b.Fatal(err)
			}
		}
		b.Logf("seeded %d billed usage logs over 100 tenants and 12 months", n)
	}
	ds := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := alerts.ReadUsage(context.Background(), w.pool, w.tenant, nil, nil); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds())/1000, "p99-ms")
}
