// Package worktest builds the world of end-to-end billing tests: a fresh
// migrated database, the real ingest transaction, the Stripe emulator on
// loopback, the real stripe-go client and real River workers.
package worktest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/stripeclient"
	"github.com/overage-billing/overage/stripeclient/emulator"
	"github.com/overage-billing/overage/tenants"
	"github.com/overage-billing/overage/workers"
)

// TryRecord ingests one usage event through the real ingest transaction
// under a fresh key and returns its usage log id. It does not touch t, so
// goroutines may call it.
func TryRecord(ctx context.Context, svc *ingest.Service, tenantID uuid.UUID, ts time.Time, in, out int64) (uuid.UUID, error) {
	key := uuid.NewString()
	o, err := svc.Record(ctx, ingest.RecordParams{
		TenantID: tenantID, Key: key, Fingerprint: []byte(key),
		Event: &ingest.Event{Timestamp: ts.UTC().Truncate(time.Microsecond), UserID: "u", ModelID: "m", InputTokens: in, OutputTokens: out},
	})
	if err != nil {
		return uuid.Nil, err
	}
	if o.Kind != ingest.OutcomeNew {
		return uuid.Nil, fmt.Errorf("recording a new event answered %s: %s", o.Kind, o.Body)
	}
	return o.UsageLogID, nil
}

// Record is TryRecord failing t on error.
func Record(t testing.TB, svc *ingest.Service, tenantID uuid.UUID, ts time.Time, in, out int64) uuid.UUID {
	t.Helper()
	id, err := TryRecord(context.Background(), svc, tenantID, ts, in, out)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// Options shape a World.
type Options struct {
	Emulator emulator.Options
	// IngestMaxAttempts is REPORT_MAX_ATTEMPTS of the jobs ingest queues
	// (default 5).
	IngestMaxAttempts int
	// Tenants to create; a tenant without a name is named after its
	// customer.
	Tenants []tenants.CreateParams
	// BatchDelay is REPORT_BATCH_DELAY of ingest's and the workers' report
	// jobs (default 200 ms, so tests wait little for a report).
	BatchDelay time.Duration
}

// World is one test's billing world.
type World struct {
	Pool    *pgxpool.Pool
	Emu     *emulator.Emulator
	Stripe  *stripeclient.Client
	River   *river.Client[pgx.Tx] // insert-only, as `overage serve` has
	Ingest  *ingest.Service
	Tenants map[string]*tenants.Created // by Stripe customer id
	// BatchDelay is the report jobs' REPORT_BATCH_DELAY.
	BatchDelay time.Duration
}

// New builds a World that lives until t ends.
func New(t *testing.T, opts Options) *World {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	if opts.Emulator.Seed == 0 {
		opts.Emulator.Seed = 7
	}
	emu := emulator.New(opts.Emulator)
	base, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	sc, err := stripeclient.New(stripeclient.Config{SecretKey: "sk_test_123", APIBase: base, RateLimit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := app.NewInsertClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if opts.IngestMaxAttempts == 0 {
		opts.IngestMaxAttempts = outbox.DefaultMaxAttempts
	}
	if opts.BatchDelay == 0 {
		opts.BatchDelay = 200 * time.Millisecond
	}
	w := &World{Pool: pool, Emu: emu, Stripe: sc, River: rc, BatchDelay: opts.BatchDelay,
		Ingest: app.NewIngest(pool, rc, &app.IngestConfig{Report: app.ReportConfig{MaxAttempts: opts.IngestMaxAttempts, BatchDelay: opts.BatchDelay},
			Coalesce: ingest.DefaultGroupsInFlight}),
		Tenants: map[string]*tenants.Created{}}
	for _, p := range opts.Tenants {
		if p.Name == "" {
			p.Name = "tenant " + p.StripeCustomerID
		}
		tn, err := tenants.NewStore(pool).Create(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		w.Tenants[p.StripeCustomerID] = tn
	}
	return w
}

// Record ingests an event of customer's tenant, timestamped a minute ago.
func (w *World) Record(t testing.TB, customer string, in, out int64) uuid.UUID {
	t.Helper()
	return Record(t, w.Ingest, w.Tenants[customer].ID, time.Now().Add(-time.Minute), in, out)
}

// Start runs real workers, reporting to the emulator, until stop or the end
// of the test; calling stop and starting again is a process restart. The
// sweep runs hourly unless cfg asks for more.
func (w *World) Start(t *testing.T, cfg workers.Config) (stop func()) {
	t.Helper()
	cfg.Stripe = w.Stripe
	if cfg.BatchDelay == 0 {
		cfg.BatchDelay = w.BatchDelay
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = time.Hour
	}
	wk, err := workers.New(w.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wk.Run(ctx) }()
	var stopped atomic.Bool
	stop = func() {
		if stopped.CompareAndSwap(false, true) {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("workers stopped with %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return stop
}

// KeyedRequests returns what the emulator received for the meter event
// key of id (a log, or a report's lead) and d, failing t unless each
// carried that key as both its Idempotency-Key and its identifier.
func (w *World) KeyedRequests(t testing.TB, id uuid.UUID, d overage.Dimension) []emulator.Request {
	t.Helper()
	want := overage.MeterEventKey(id, d)
	var out []emulator.Request
	for _, r := range w.Emu.Requests() {
		if r.Identifier == want || r.IdempotencyKey == want {
			if r.Identifier != want || r.IdempotencyKey != want {
				t.Fatalf("request for %s carried key %q and identifier %q, want both %q", id, r.IdempotencyKey, r.Identifier, want)
			}
			out = append(out, r)
		}
	}
	return out
}
