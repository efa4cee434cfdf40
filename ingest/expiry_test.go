package ingest_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/ingest"
)

// A stored answer is replayed until its record expires, to the second, in
// whichever partition the record lives: the first (which spans the days
// before the migration's bound) or a day partition, today's or
// tomorrow's. A record that expired a second ago starts a new request.
func TestKeyExpiryHoldsInEveryPartition(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"first partition", "day partitions"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			if layout == "day partitions" {
				// As a database is once the first partition has expired.
				if _, err := b.pool.Exec(ctx, `DROP TABLE idempotency_keys_legacy`); err != nil {
					t.Fatal(err)
				}
				if _, err := idempotency.EnsurePartitions(ctx, b.pool); err != nil {
					t.Fatal(err)
				}
			}
			for _, key := range []string{"almost", "gone", "fresh"} {
				requireStatus(t, b.post(t, b.alice.APIKey, key, event(1, 1)), http.StatusAccepted)
			}
			// Stored 24 h - 2 s ago, and 24 h + 1 s ago; "fresh" just now.
			move := func(key, to string) {
				if _, err := b.pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = `+to+` WHERE idempotency_key = $1`, key); err != nil {
					t.Fatal(err)
				}
			}
			move("almost", "now() + interval '2 seconds'")
			move("gone", "now() - interval '1 second'")
			where := map[string]string{}
			for _, key := range []string{"almost", "gone", "fresh"} {
				var part string
				if err := b.pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM idempotency_keys WHERE idempotency_key = $1`, key).Scan(&part); err != nil {
					t.Fatal(err)
				}
				where[key] = part
			}
			if layout == "day partitions" && where["almost"] == where["fresh"] {
				t.Fatalf("records expiring today and tomorrow share partition %s; the test covers one partition only", where["fresh"])
			}
			logs := b.logs(t)
			for _, key := range []string{"almost", "fresh"} {
				r := b.post(t, b.alice.APIKey, key, event(1, 1))
				requireStatus(t, r, http.StatusAccepted)
				if r.header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("key %q (record in %s) was not replayed before it expired: %s", key, where[key], r.body)
				}
			}
			r := b.post(t, b.alice.APIKey, "gone", event(2, 2))
			requireStatus(t, r, http.StatusAccepted)
			if r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("key %q (record in %s) was replayed a second after it expired", "gone", where["gone"])
			}
			if got := b.logs(t); got != logs+1 {
				t.Fatalf("%d usage logs, want %d: only the expired key records anew", got, logs+1)
			}
			if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'gone'`); n != 1 {
				t.Fatalf("%d records of the expired key after it was reused, want 1 (the expired one replaced)", n)
			}
		})
	}
}

// Expired partitions are dropped while a tenant's events arrive from four
// clients: no request fails or waits out its deadline, every key keeps
// exactly its one record, and only the partitions whose records had all
// expired are gone.
func TestPartitionDropsUnderIngestLoseNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `DROP TABLE idempotency_keys_legacy`); err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.EnsurePartitions(ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	var today time.Time
	if err := b.pool.QueryRow(ctx, `SELECT date_trunc('day', now(), 'UTC')`).Scan(&today); err != nil {
		t.Fatal(err)
	}
	var old []string
	for back := 2; back <= 4; back++ {
		d := today.UTC().AddDate(0, 0, -back)
		name := "idempotency_keys_" + d.Format("20060102")
		old = append(old, name)
		if _, err := b.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s PARTITION OF idempotency_keys FOR VALUES FROM ('%s') TO ('%s')`,
			name, d.Format(time.RFC3339), d.AddDate(0, 0, 1).Format(time.RFC3339))); err != nil {
			t.Fatal(err)
		}
		if _, err := b.pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
			SELECT $1, 'expired-' || $3::text || '-' || g, '\x00', 202, '\x7b7d', $2::timestamptz + g * interval '1 minute' FROM generate_series(0, 999) g`,
			b.alice.ID, d, name); err != nil {
			t.Fatal(err)
		}
	}
	record := func(key string) (*ingest.Outcome, error) {
		ev := &ingest.Event{UserID: "u", ModelID: "m", InputTokens: 1, OutputTokens: 1, Timestamp: time.Now().UTC().Truncate(time.Microsecond)}
		return b.svc.Record(ctx, ingest.RecordParams{TenantID: b.alice.ID, Key: key, Fingerprint: []byte(key), Event: ev})
	}
	load := startEventLoad(4, "k", 5*time.Second, record)
	waitFor(t, "ingest under way", func() bool { return load.recorded(t) >= 30 })
	err := idempotency.Maintain(ctx, b.pool, slog.New(slog.DiscardHandler))
	at := load.recorded(t)
	waitFor(t, "ingest after the drops", func() bool { return load.recorded(t) >= at+30 })
	keys := load.finish(t)
	if err != nil {
		t.Fatalf("maintain under ingest: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM pg_class WHERE relname = ANY($1)`, old); n != 0 {
		t.Fatalf("%d of the expired partitions %v are still there", n, old)
	}
	if n := b.count(t, `SELECT count(DISTINCT idempotency_key) FROM idempotency_keys WHERE idempotency_key LIKE 'k-%'`); n != len(keys) {
		t.Fatalf("%d keys recorded, %d with records", len(keys), n)
	}
	for _, key := range []string{keys[0], keys[len(keys)-1]} {
		if out, err := record(key); err != nil || out.Kind != ingest.OutcomeReplay {
			t.Fatalf("key %s after the drops: %+v, %v; want a replay", key, out, err)
		}
	}
}
