package meters_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/meters"
)

const inputEvent, outputEvent = "tokens_in_test", "tokens_out_test"

var pgxTxOptions = pgx.TxOptions{IsoLevel: pgx.RepeatableRead}

func newStore(t *testing.T) (*meters.Store, *pgxpool.Pool) {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	return meters.NewStore(pool, inputEvent, outputEvent), pool
}

func code(err error) overage.ErrorCode {
	var e *overage.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func catalogVersion(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var v int64
	if err := pool.QueryRow(context.Background(), `SELECT version FROM meter_catalog`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestListHasTheDefaultsNamedByTheSettings: the two default meters exist
// from the migration on, and their event names are the store's settings
// (STRIPE_METER_*_EVENT), not anything stored.
func TestListHasTheDefaultsNamedByTheSettings(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	ms, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 {
		t.Fatalf("List = %+v, want the two default meters", ms)
	}
	for i, want := range []overage.Meter{
		{Key: "input", EventName: inputEvent, TokenType: overage.TokenInput, Models: []string{"*"}},
		{Key: "output", EventName: outputEvent, TokenType: overage.TokenOutput, Models: []string{"*"}},
	} {
		got := ms[i]
		if got.Key != want.Key || got.EventName != want.EventName || got.TokenType != want.TokenType ||
			!slices.Equal(got.Models, want.Models) || got.ArchivedAt != nil || got.CreatedAt.IsZero() {
			t.Errorf("meter %d = %+v, want %+v", i, got, want)
		}
	}
	// Another process with other settings names them its way.
	other, err := meters.NewStore(pool, "in_b", "out_b").List(ctx)
	if err != nil || other[0].EventName != "in_b" || other[1].EventName != "out_b" {
		t.Fatalf("List with other settings = %+v, %v", other, err)
	}
}

// TestCreateArchiveAndList: a created meter is listed as stored and
// routes new usage through the catalog; archiving it stops that, keeps it
// listed, is idempotent, and frees its patterns; each change raises the
// catalog version once.
func TestCreateArchiveAndList(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	v0 := catalogVersion(t, pool)

	m, err := s.Create(ctx, meters.CreateParams{Key: "gpt4o_in", EventName: "gpt4o_input", TokenType: overage.TokenInput,
		Models: []string{"gpt-4o", "gpt-4o-2024-*"}})
	if err != nil {
		t.Fatal(err)
	}
	if m.Key != "gpt4o_in" || m.EventName != "gpt4o_input" || m.TokenType != overage.TokenInput ||
		!slices.Equal(m.Models, []string{"gpt-4o", "gpt-4o-2024-*"}) || m.ArchivedAt != nil || m.CreatedAt.IsZero() {
		t.Fatalf("Create = %+v", m)
	}
	if v := catalogVersion(t, pool); v != v0+1 {
		t.Fatalf("catalog version %d after a create, want %d", v, v0+1)
	}
	// Models default to every model.
	all, err := s.Create(ctx, meters.CreateParams{Key: "cache_reads", EventName: "cache_reads", TokenType: overage.TokenCacheRead})
	if err != nil || !slices.Equal(all.Models, []string{"*"}) {
		t.Fatalf("Create without models = %+v, %v", all, err)
	}

	c, err := s.Catalog(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Route("gpt-4o"); r[0] != "gpt4o_in" || r[1] != "cache_reads" {
		t.Fatalf("the catalog after the creates routes gpt-4o %v", r)
	}
	ms, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, m := range ms {
		keys = append(keys, m.Key)
	}
	if !slices.Equal(keys, []string{"cache_reads", "gpt4o_in", "input", "output"}) {
		t.Fatalf("List keys = %v, want them by key", keys)
	}

	archived, err := s.Archive(ctx, "gpt4o_in")
	if err != nil || archived.ArchivedAt == nil || archived.EventName != "gpt4o_input" {
		t.Fatalf("Archive = %+v, %v", archived, err)
	}
	v1 := catalogVersion(t, pool)
	again, err := s.Archive(ctx, "gpt4o_in")
	if err != nil || again.ArchivedAt == nil || !again.ArchivedAt.Equal(*archived.ArchivedAt) {
		t.Fatalf("Archive again = %+v, %v; want the first archive's time", again, err)
	}
	if v := catalogVersion(t, pool); v != v1 {
		t.Fatalf("archiving an archived meter moved the catalog version from %d to %d", v1, v)
	}
	c, err = s.Catalog(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Route("gpt-4o"); r[0] != overage.MeterInput || r[1] != "cache_reads" {
		t.Fatalf("after the archive, gpt-4o routes %v; want input back on the default", r)
	}
	if m, ok := c.Meter("gpt4o_in"); !ok || m.ArchivedAt == nil {
		t.Fatalf("the catalog forgot the archived meter: %+v %v", m, ok)
	}

	// The archived meter's patterns are free again; its key is not.
	if _, err := s.Create(ctx, meters.CreateParams{Key: "gpt4o_in_v2", EventName: "gpt4o_input_v2", TokenType: overage.TokenInput,
		Models: []string{"gpt-4o"}}); err != nil {
		t.Fatalf("a pattern of an archived meter: %v", err)
	}
	_, err = s.Create(ctx, meters.CreateParams{Key: "gpt4o_in", EventName: "x", TokenType: overage.TokenOutput, Models: []string{"zzz"}})
	if code(err) != overage.ECONFLICT {
		t.Fatalf("re-creating an archived meter's key: %v, want a conflict", err)
	}
	if ms, _ := s.List(ctx); len(ms) != 5 {
		t.Fatalf("List after archive and re-create has %d meters, want 5", len(ms))
	}

	if _, err := s.Archive(ctx, "no_such_meter"); code(err) != overage.ENOTFOUND {
		t.Fatalf("Archive unknown: %v, want not found", err)
	}
	for _, key := range []string{"input", "output"} {
		_, err := s.Archive(ctx, key)
		var e *overage.Error
		if !errors.As(err, &e) || e.Code != overage.EINVALID || len(e.Fields) != 1 || e.Fields[0].Field != "key" {
			t.Fatalf("Archive(%s) = %v, want a refusal naming key", key, err)
		}
	}
	var archivedDefaults int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM meters WHERE key IN ('input', 'output') AND archived_at IS NOT NULL`).
		Scan(&archivedDefaults); err != nil || archivedDefaults != 0 {
		t.Fatalf("%d default meters archived (%v)", archivedDefaults, err)
	}
}

// TestSamePatternTwiceIsAConflict: a second active meter of one token
// type with a pattern another already has is refused, whatever else it
// lists; the same pattern on another token type, and overlapping
// patterns, are fine.
func TestSamePatternTwiceIsAConflict(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	mustCreate := func(key string, typ overage.TokenType, models ...string) {
		t.Helper()
		if _, err := s.Create(ctx, meters.CreateParams{Key: key, EventName: key, TokenType: typ, Models: models}); err != nil {
			t.Fatalf("create %s: %v", key, err)
		}
	}
	mustCreate("gpt_in", overage.TokenInput, "gpt-*")
	mustCreate("gpt4_in", overage.TokenInput, "gpt-4*")     // overlaps gpt-*
	mustCreate("gpt4o_in", overage.TokenInput, "gpt-4o")    // overlaps both
	mustCreate("gpt_read", overage.TokenCacheRead, "gpt-*") // same pattern, another type
	mustCreate("every_read_write", overage.TokenCacheWrite, "*")

	for _, tc := range []struct {
		name   string
		typ    overage.TokenType
		models []string
	}{
		{"same prefix", overage.TokenInput, []string{"gpt-*"}},
		{"one of several", overage.TokenInput, []string{"claude-*", "gpt-4o", "llama-*"}},
		{"the default input's *", overage.TokenInput, []string{"*"}},
		{"the default output's *", overage.TokenOutput, []string{"*"}},
		{"cache_write's *", overage.TokenCacheWrite, []string{"*"}},
	} {
		_, err := s.Create(ctx, meters.CreateParams{Key: "dup", EventName: "dup", TokenType: tc.typ, Models: tc.models})
		var e *overage.Error
		if !errors.As(err, &e) || e.Code != overage.ECONFLICT || e.Type != "meter-exists" {
			t.Errorf("%s: %v, want 409 meter-exists", tc.name, err)
		}
	}
	// Nothing of a refused create is left: its key is still free.
	mustCreate("dup", overage.TokenReasoning, "*")
}

// TestConcurrentCreatesOfOnePatternOneWins: creates of one pattern that
// race each other — different keys, the patterns in different orders —
// end with exactly one meter and every other answer a 409: the unique
// index decides, never a read before the insert, and no deadlock.
func TestConcurrentCreatesOfOnePatternOneWins(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	const racers = 8
	for round := range 5 {
		// Every racer's first call waits on the same channel, so they
		// reach the database together.
		start := make(chan struct{})
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Many patterns, so racers that list them in opposite
				// orders are inside their inserts at the same time.
				models := make([]string, 300)
				for j := range models {
					models[j] = fmt.Sprintf("m%d-%03d", round, j)
				}
				if i%2 == 1 {
					slices.Reverse(models)
				}
				<-start
				_, errs[i] = s.Create(ctx, meters.CreateParams{Key: fmt.Sprintf("r%d_%d", round, i), EventName: "race",
					TokenType: overage.TokenInput, Models: models})
			}()
		}
		close(start)
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch code(err) {
			case "":
				if err != nil {
					t.Fatalf("round %d racer %d: %v, want success or 409", round, i, err)
				}
				won++
			case overage.ECONFLICT:
			default:
				t.Fatalf("round %d racer %d: %v, want success or 409", round, i, err)
			}
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM meters WHERE key LIKE $1`, fmt.Sprintf("r%d\\_%%", round)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if won != 1 || n != 1 {
			t.Fatalf("round %d: %d creates succeeded and %d meters stored, want 1 and 1", round, won, n)
		}
	}

	// The same key, raced: one meter, the rest 409.
	start := make(chan struct{})
	errs := make([]error, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = s.Create(ctx, meters.CreateParams{Key: "same_key", EventName: "e", TokenType: overage.TokenOutput,
				Models: []string{fmt.Sprintf("model-%d", i)}})
		}()
	}
	close(start)
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
		} else if code(err) != overage.ECONFLICT {
			t.Fatalf("same key raced: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("same key raced: %d creates succeeded, want 1", won)
	}
}

// TestCreateValidationNamesFields: every bad field is named, all at once,
// and nothing is stored.
func TestCreateValidationNamesFields(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		p      meters.CreateParams
		fields []string
	}{
		{"everything missing", meters.CreateParams{}, []string{"key", "event_name", "token_type"}},
		{"bad key", meters.CreateParams{Key: "GPT-4o", EventName: "e", TokenType: "input", Models: []string{"x"}}, []string{"key"}},
		{"key too long", meters.CreateParams{Key: strings.Repeat("k", 41), EventName: "e", TokenType: "input"}, []string{"key"}},
		{"a default's key", meters.CreateParams{Key: "output", EventName: "e", TokenType: "output", Models: []string{"x"}}, []string{"key"}},
		{"event name with spaces", meters.CreateParams{Key: "k", EventName: " e ", TokenType: "input", Models: []string{"x"}}, []string{"event_name"}},
		{"event name too long", meters.CreateParams{Key: "k", EventName: strings.Repeat("e", 101), TokenType: "input", Models: []string{"x"}}, []string{"event_name"}},
		{"a NUL in the event name", meters.CreateParams{Key: "k", EventName: "e\x00", TokenType: "input", Models: []string{"x"}}, []string{"event_name"}},
		{"a NUL in a pattern", meters.CreateParams{Key: "k", EventName: "e", TokenType: "input", Models: []string{"gpt\x00*"}}, []string{"models"}},
		{"unknown token type", meters.CreateParams{Key: "k", EventName: "e", TokenType: "cached", Models: []string{"x"}}, []string{"token_type"}},
		{"* inside a pattern", meters.CreateParams{Key: "k", EventName: "e", TokenType: "input", Models: []string{"gpt-*-mini"}}, []string{"models"}},
		{"empty pattern", meters.CreateParams{Key: "k", EventName: "e", TokenType: "input", Models: []string{""}}, []string{"models"}},
		{"a pattern twice", meters.CreateParams{Key: "k", EventName: "e", TokenType: "input", Models: []string{"a", "a"}}, []string{"models"}},
		{"several at once", meters.CreateParams{Key: "K", EventName: "", TokenType: "x", Models: []string{"*x"}}, []string{"key", "event_name", "token_type", "models"}},
	} {
		_, err := s.Create(ctx, tc.p)
		var e *overage.Error
		if !errors.As(err, &e) || e.Code != overage.EINVALID {
			t.Errorf("%s: %v, want validation-failed", tc.name, err)
			continue
		}
		var got []string
		for _, f := range e.Fields {
			got = append(got, f.Field)
		}
		if !slices.Equal(got, tc.fields) {
			t.Errorf("%s: fields %v, want %v", tc.name, got, tc.fields)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM meters`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d meters stored after refused creates (%v), want the 2 defaults", n, err)
	}
}

// TestCatalogSeesChangesOfOtherProcesses: a store keeps its catalog until
// its own change or a newer version says otherwise; a change another
// process committed is read by Current (given the version a transaction
// read) and by Knowing (given a key it does not know).
func TestCatalogSeesChangesOfOtherProcesses(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	other := meters.NewStore(pool, inputEvent, outputEvent)
	ctx := context.Background()
	c0, err := s.Catalog(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Create(ctx, meters.CreateParams{Key: "elsewhere", EventName: "e", TokenType: overage.TokenCacheRead}); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Catalog(ctx, pool); c != c0 {
		t.Fatal("Catalog re-read the database without a reason; it is meant to be kept")
	}
	if c, err := s.Knowing(ctx, pool, []string{"input", "elsewhere"}); err != nil {
		t.Fatal(err)
	} else if _, ok := c.Meter("elsewhere"); !ok {
		t.Fatal("Knowing did not reload for a key it lacked")
	}
	if _, err := other.Archive(ctx, "elsewhere"); err != nil {
		t.Fatal(err)
	}
	v := catalogVersion(t, pool)
	c, err := s.Current(ctx, pool, v)
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != v || c.Route("m")[1] != overage.MeterInput {
		t.Fatalf("Current(%d) = version %d routing %v", v, c.Version, c.Route("m"))
	}
	if again, _ := s.Current(ctx, pool, v); again != c {
		t.Fatal("Current re-read a catalog that was current")
	}
}

// TestOwnChangeIsNeverUndoneByAnOlderRead: a catalog read that began
// before this store's change and ends after it must not become the kept
// catalog, or the change would not route until the next one.
func TestOwnChangeIsNeverUndoneByAnOlderRead(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	// A transaction that read the catalog before the create, as a slow
	// reader would; REPEATABLE READ keeps its snapshot.
	tx, err := pool.BeginTx(ctx, pgxTxOptions)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var v0 int64
	if err := tx.QueryRow(ctx, `SELECT version FROM meter_catalog`).Scan(&v0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, meters.CreateParams{Key: "fresh", EventName: "fresh", TokenType: overage.TokenInput, Models: []string{"m"}}); err != nil {
		t.Fatal(err)
	}
	// The old snapshot's catalog arrives after the change.
	old, err := s.Current(ctx, tx, v0+1)
	if err != nil {
		t.Fatal(err)
	}
	if old.Version != v0 {
		t.Fatalf("the old snapshot read version %d, want %d", old.Version, v0)
	}
	c, err := s.Catalog(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if c.Route("m")[0] != "fresh" {
		t.Fatalf("after its own create, the store routes m %v: an older read replaced the catalog", c.Route("m"))
	}
}
