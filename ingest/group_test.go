package ingest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/ingest"
	"github.com/overage-billing/overage/internal/testkit/polltest"
)

// gate holds every ingest transaction of a service before its writes until
// it is opened, and records the size of every coalesced group, so a test
// can fill a tenant's pending list and see it recorded in one transaction.
type gate struct {
	svc     *ingest.Service
	open    chan struct{}
	opened  sync.Once
	mu      sync.Mutex
	sizes   []int
	entered int // transactions that reached the gate
	// fail, when set as a transaction reaches the gate, answers its
	// beforeWrites once the gate opens.
	fail func() error
}

func holdGroups(t *testing.T, svc *ingest.Service) *gate {
	t.Helper()
	g := &gate{svc: svc, open: make(chan struct{})}
	ingest.SetOnGroup(svc, func(n int) {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.sizes = append(g.sizes, n)
	})
	ingest.SetBeforeWrites(svc, func(ctx context.Context) error {
		g.mu.Lock()
		g.entered++
		fail := g.fail
		g.mu.Unlock()
		select {
		case <-g.open:
		case <-ctx.Done():
			return ctx.Err()
		}
		if fail != nil {
			return fail()
		}
		return nil
	})
	t.Cleanup(g.release)
	return g
}

func (g *gate) release() { g.opened.Do(func() { close(g.open) }) }

// started is how many requests joined a group so far.
func (g *gate) started() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, s := range g.sizes {
		n += s
	}
	return n
}

// held is how many transactions reached the gate so far.
func (g *gate) held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.entered
}

func (g *gate) groups() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.sizes)
}

// waitFor polls cond until it holds, failing t after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	polltest.Until(t, what, 20*time.Second, cond)
}

// posted sends n requests concurrently (request i from req(i)) and returns
// a wait for their answers, in order.
func posted(n int, req func(i int) response) func() []response {
	out := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = req(i)
		}()
	}
	return func() []response { wg.Wait(); return out }
}

// fillGroup holds at a gate as many transactions of the tenant as may run
// at once, and returns the gate and their answers' wait: every request sent
// after it waits in the pending list until the gate opens. The blockers repeat the request_id of
// a log recorded first (1 input and 1 output token): they take no period
// lock and queue no report job, so none waits for another on its way to
// the gate. They add one log and 1 + DefaultGroupsInFlight stored answers.
func fillGroup(t *testing.T, b *bundle, apiKey string) (*gate, func() []response) {
	t.Helper()
	const body = `{"request_id":"blocker","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":1}`
	requireStatus(t, b.post(t, apiKey, "blocker-seed", body), http.StatusAccepted)
	g := holdGroups(t, b.svc)
	var waits []func() []response
	for i := range ingest.DefaultGroupsInFlight {
		waits = append(waits, posted(1, func(int) response { return b.post(t, apiKey, fmt.Sprintf("blocker-%d", i), body) }))
		waitFor(t, "a blocker's transaction at the gate", func() bool { return g.held() == i+1 })
	}
	return g, func() []response {
		var out []response
		for _, w := range waits {
			out = append(out, w()...)
		}
		return out
	}
}

// blockerLogs and blockerRecords are what fillGroup adds.
const blockerLogs, blockerRecords = 1, 1 + ingest.DefaultGroupsInFlight

func TestCoalescedSingleEventsSplitTheAllowanceExactly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := holdGroups(t, b.svc)
	const n = 40 // 40 x 130 = 5200 input tokens against 1000, 40 x 40 = 1600 output against 500
	body := func(i int) string {
		return fmt.Sprintf(`{"request_id":"r%d","user_id":"u","model_id":"m","input_tokens":130,"output_tokens":40}`, i)
	}
	wait := posted(n, func(i int) response { return b.post(t, b.capped.APIKey, fmt.Sprintf("k%d", i), body(i)) })
	// At most DefaultGroupsInFlight transactions run (held); the others wait.
	waitFor(t, "every event in a group or pending", func() bool { return g.started()+ingest.Pending(b.svc, b.capped.ID) == n })
	g.release()
	answers := wait()
	for _, r := range answers {
		requireStatus(t, r, http.StatusAccepted)
	}
	if sizes := g.groups(); slices.Max(sizes) < 2 || len(sizes) >= n {
		t.Fatalf("group sizes %v: the events were not coalesced", sizes)
	}
	var in, out int64
	if err := b.pool.QueryRow(context.Background(), "SELECT sum(coalesce(overage_input_tokens, input_tokens)), sum(coalesce(overage_output_tokens, output_tokens)) FROM usage_logs").Scan(&in, &out); err != nil {
		t.Fatal(err)
	}
	if in != n*130-1000 || out != n*40-500 {
		t.Fatalf("total overage = %d/%d, want %d/%d", in, out, n*130-1000, n*40-500)
	}
	if c := b.count(t, "SELECT count(*) FROM usage_logs WHERE coalesce(overage_input_tokens, input_tokens) BETWEEN 1 AND 129"); c != 1 {
		t.Fatalf("%d events straddle the input allowance, want exactly 1", c)
	}
	if c := b.count(t, "SELECT count(*) FROM usage_logs WHERE coalesce(overage_output_tokens, output_tokens) BETWEEN 1 AND 39"); c != 1 {
		t.Fatalf("%d events straddle the output allowance, want exactly 1", c)
	}
	if b.logs(t) != n || b.records(t) != n {
		t.Fatalf("logs/records = %d/%d, want %d/%d", b.logs(t), b.records(t), n, n)
	}
	// Each key has its own stored answer, replayed byte for byte.
	ids := map[any]bool{}
	for i, first := range answers {
		ids[first.json(t)["id"]] = true
		again := b.post(t, b.capped.APIKey, fmt.Sprintf("k%d", i), body(i))
		requireStatus(t, again, http.StatusAccepted)
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(first.body, again.body) {
			t.Fatalf("replay of k%d differs or is unmarked:\n%s\n%s", i, first.body, again.body)
		}
	}
	if len(ids) != n {
		t.Fatalf("%d distinct logs in %d answers", len(ids), n)
	}
}

func TestCoalescedSameKeyRecordsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g, blockers := fillGroup(t, b, b.alice.APIKey)
	const n = 40 // every other request under one key, the rest under their own
	key := func(i int) string {
		if i%2 == 0 {
			return "same"
		}
		return fmt.Sprintf("own-%d", i)
	}
	wait := posted(n, func(i int) response { return b.post(t, b.alice.APIKey, key(i), event(100, 10)) })
	// The first request under the shared key waits for a group; the others
	// answer 409 in progress at once, as on meeting its lock.
	waitFor(t, "every event pending", func() bool { return ingest.Pending(b.svc, b.alice.ID) == n/2+1 })
	// So does a request under a key whose transaction is running.
	requireProblem(t, b.post(t, b.alice.APIKey, "blocker-0", `{"request_id":"blocker","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":1}`),
		http.StatusConflict, "idempotency-key-in-progress")
	g.release()
	blockers()
	answers := wait()
	if got, want := b.logs(t), blockerLogs+1+n/2; got != want {
		t.Fatalf("logs = %d, want %d: one for the shared key", got, want)
	}
	var sameID string
	if err := b.pool.QueryRow(context.Background(), "SELECT usage_log_id::text FROM idempotency_keys WHERE idempotency_key = 'same'").Scan(&sameID); err != nil {
		t.Fatal(err)
	}
	for i, r := range answers {
		switch {
		case r.status == http.StatusAccepted && (i%2 == 1 || r.json(t)["id"] == sameID):
		case r.status == http.StatusConflict && i%2 == 0:
			requireProblem(t, r, http.StatusConflict, "idempotency-key-in-progress")
		default:
			t.Fatalf("request %d under %s: %d %s", i, key(i), r.status, r.body)
		}
	}
	if sizes := g.groups(); slices.Max(sizes) < 2 {
		t.Fatalf("group sizes %v: the events were not coalesced", sizes)
	}
}

func TestCoalescedSameRequestIDUnderManyKeysRecordsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g, blockers := fillGroup(t, b, b.alice.APIKey)
	const n = 32
	body := `{"request_id":"chatcmpl-shared","user_id":"u","model_id":"m","input_tokens":5,"output_tokens":5}`
	wait := posted(n, func(i int) response { return b.post(t, b.alice.APIKey, fmt.Sprintf("k%d", i), body) })
	waitFor(t, "every event pending", func() bool { return ingest.Pending(b.svc, b.alice.ID) == n })
	g.release()
	blockers()
	answers := wait()
	if sizes := g.groups(); !slices.Contains(sizes, n) {
		t.Fatalf("group sizes %v, want one group of all %d", sizes, n)
	}
	var id string
	if err := b.pool.QueryRow(context.Background(), "SELECT id::text FROM usage_logs WHERE request_id = 'chatcmpl-shared'").Scan(&id); err != nil {
		t.Fatal(err)
	}
	created := 0
	for i, r := range answers {
		m := r.json(t)
		if m["id"] != id {
			t.Fatalf("answer %d names log %v, want %s", i, m["id"], id)
		}
		switch {
		case r.status == http.StatusAccepted && m["duplicate"] == false:
			created++
		case r.status == http.StatusOK && m["duplicate"] == true:
		default:
			t.Fatalf("answer %d: %d %s", i, r.status, r.body)
		}
		again := b.post(t, b.alice.APIKey, fmt.Sprintf("k%d", i), body)
		if again.status != r.status || !bytes.Equal(again.body, r.body) || again.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay of k%d differs: %d %s, first %d %s", i, again.status, again.body, r.status, r.body)
		}
	}
	if created != 1 {
		t.Fatalf("%d answers created the log, want 1", created)
	}
	// A duplicate answered in the group that recorded the log is the one a
	// transaction of its own gives afterwards.
	later := b.post(t, b.alice.APIKey, "later", body)
	requireStatus(t, later, http.StatusOK)
	for i, r := range answers {
		if r.status == http.StatusOK && !bytes.Equal(r.body, later.body) {
			t.Fatalf("duplicate %d in the group differs from one after it:\n%s\n%s", i, r.body, later.body)
		}
	}
	if got := b.count(t, "SELECT count(*) FROM usage_logs WHERE request_id = 'chatcmpl-shared'"); got != 1 {
		t.Fatalf("%d logs of the request_id, want 1", got)
	}
}

// One group with every kind of member: an expired key recorded anew, a
// replay, a key reused with another body, and fresh events.
func TestCoalescedGroupAnswersEachMemberAsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	replayed := b.post(t, b.alice.APIKey, "replay", event(3, 3))
	requireStatus(t, replayed, http.StatusAccepted)
	requireStatus(t, b.post(t, b.alice.APIKey, "reused", event(4, 4)), http.StatusAccepted)
	requireStatus(t, b.post(t, b.alice.APIKey, "expired", event(5, 5)), http.StatusAccepted)
	if _, err := b.pool.Exec(context.Background(), "UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE idempotency_key = 'expired'"); err != nil {
		t.Fatal(err)
	}

	g, blockers := fillGroup(t, b, b.alice.APIKey)
	reqs := []struct{ key, body string }{
		{"fresh-0", event(10, 1)}, {"replay", event(3, 3)}, {"fresh-1", event(11, 1)},
		{"reused", event(400, 4)}, {"expired", event(6, 6)}, {"fresh-2", event(12, 1)},
	}
	wait := posted(len(reqs), func(i int) response { return b.post(t, b.alice.APIKey, reqs[i].key, reqs[i].body) })
	waitFor(t, "every event pending", func() bool { return ingest.Pending(b.svc, b.alice.ID) == len(reqs) })
	g.release()
	blockers()
	answers := wait()
	if sizes := g.groups(); !slices.Contains(sizes, len(reqs)) {
		t.Fatalf("group sizes %v, want one group of all %d", sizes, len(reqs))
	}
	for i, r := range answers {
		switch reqs[i].key {
		case "replay":
			requireStatus(t, r, http.StatusAccepted)
			if r.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, replayed.body) {
				t.Fatalf("replay differs or unmarked: %s, first %s", r.body, replayed.body)
			}
		case "reused":
			requireProblem(t, r, http.StatusConflict, "idempotency-key-reused")
		default: // fresh, and the expired key starting a new request
			requireStatus(t, r, http.StatusAccepted)
			if r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("%s answered as a replay: %s", reqs[i].key, r.body)
			}
			if in := r.json(t)["input_tokens"]; fmt.Sprint(in) != fmt.Sprint(r.json(t)["overage"].(map[string]any)["input_tokens"]) {
				t.Fatalf("%s: unexpected body %s", reqs[i].key, r.body)
			}
		}
	}
	// 3 before, the blockers', 3 fresh and the expired key's new event.
	if got, want := b.logs(t), 3+blockerLogs+4; got != want {
		t.Fatalf("logs = %d, want %d", got, want)
	}
	if got, want := b.records(t), 3+blockerRecords+3; got != want {
		t.Fatalf("records = %d, want %d", got, want)
	}
	var in int64
	if err := b.pool.QueryRow(context.Background(), `SELECT l.input_tokens FROM idempotency_keys k JOIN usage_logs l ON l.id = k.usage_log_id
		WHERE k.idempotency_key = 'expired'`).Scan(&in); err != nil || in != 6 {
		t.Fatalf("the expired key's stored answer names a log of %d input tokens (%v), want the new event's 6", in, err)
	}
}

func TestCoalescedGroupFailureAnswersEveryMember(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		err    error
		status int
	}{
		{"retryable", &pgconn.PgError{Code: "40P01", Message: "injected deadlock"}, http.StatusAccepted},
		{"fatal", errors.New("injected failure"), http.StatusInternalServerError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			g, blockers := fillGroup(t, b, b.capped.APIKey)
			const n = 10
			body := func(i int) string {
				return fmt.Sprintf(`{"request_id":"r%d","user_id":"u","model_id":"m","input_tokens":150,"output_tokens":1}`, i)
			}
			wait := posted(n, func(i int) response { return b.post(t, b.capped.APIKey, fmt.Sprintf("k%d", i), body(i)) })
			waitFor(t, "every event pending", func() bool { return ingest.Pending(b.svc, b.capped.ID) == n })
			// The blockers are at the gate, past taking it: only the group
			// of the n pending events fails, on its first attempt.
			var once sync.Once
			g.mu.Lock()
			g.fail = func() error {
				var err error
				once.Do(func() { err = tc.err })
				return err
			}
			g.mu.Unlock()
			g.release()
			for _, r := range blockers() {
				requireStatus(t, r, http.StatusOK) // the seed's duplicate
			}
			answers := wait()
			for _, r := range answers {
				if tc.status == http.StatusAccepted {
					requireStatus(t, r, http.StatusAccepted)
				} else {
					requireProblem(t, r, tc.status, "internal")
				}
			}
			if sizes := g.groups(); !slices.Contains(sizes, n) {
				t.Fatalf("group sizes %v, want one group of all %d", sizes, n)
			}
			logs, records := blockerLogs, blockerRecords
			if tc.status == http.StatusAccepted {
				logs, records = logs+n, records+n
			}
			if b.logs(t) != logs || b.records(t) != records {
				t.Fatalf("logs/records = %d/%d, want %d/%d", b.logs(t), b.records(t), logs, records)
			}
			// Sent again, every event is recorded once, the allowance split
			// exactly: 10 x 150 and the blockers' 1 against 1000 included.
			for i := range n {
				r := b.post(t, b.capped.APIKey, fmt.Sprintf("k%d", i), body(i))
				requireStatus(t, r, http.StatusAccepted)
			}
			if b.logs(t) != blockerLogs+n || b.records(t) != blockerRecords+n {
				t.Fatalf("after resending: logs/records = %d/%d, want %d/%d", b.logs(t), b.records(t), blockerLogs+n, blockerRecords+n)
			}
			var over int64
			if err := b.pool.QueryRow(context.Background(), "SELECT sum(coalesce(overage_input_tokens, input_tokens)) FROM usage_logs").Scan(&over); err != nil {
				t.Fatal(err)
			}
			if want := int64(n*150 + 1 - 1000); over != want {
				t.Fatalf("input overage = %d, want %d", over, want)
			}
		})
	}
}

// A client that hangs up while its event waits leaves the pending list; one
// whose event's group is running does not cancel the group.
func TestCoalescedMemberHangingUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := holdGroups(t, b.svc)
	record := func(ctx context.Context, key string) (*ingest.Outcome, error) {
		ev := &ingest.Event{UserID: "u", ModelID: "m", InputTokens: 1, OutputTokens: 1, Timestamp: time.Now().UTC().Truncate(time.Microsecond)}
		return b.svc.Record(ctx, ingest.RecordParams{TenantID: b.alice.ID, Key: key, Fingerprint: []byte(key), Event: ev})
	}
	type result struct {
		out *ingest.Outcome
		err error
	}
	var others sync.WaitGroup
	defer others.Wait()
	leaderCtx, hangUpLeader := context.WithCancel(context.Background())
	leader := make(chan result, 1)
	go func() { out, err := record(leaderCtx, "leader"); leader <- result{out, err} }()
	waitFor(t, "the leader's transaction", func() bool { return g.started() == 1 })
	for i := 1; i < ingest.DefaultGroupsInFlight; i++ {
		others.Add(1)
		go func() { defer others.Done(); _, _ = record(context.Background(), fmt.Sprintf("other-%d", i)) }()
		waitFor(t, "another transaction", func() bool { return g.started() == i+1 })
	}
	waiterCtx, hangUpWaiter := context.WithCancel(context.Background())
	waiter := make(chan result, 1)
	go func() { out, err := record(waiterCtx, "waiter"); waiter <- result{out, err} }()
	waitFor(t, "the waiter pending", func() bool { return ingest.Pending(b.svc, b.alice.ID) == 1 })
	hangUpWaiter()
	if r := <-waiter; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("a pending event whose client hung up: %v, %v; want context.Canceled", r.out, r.err)
	}
	if p := ingest.Pending(b.svc, b.alice.ID); p != 0 {
		t.Fatalf("%d events pending after the waiter left, want 0", p)
	}
	// One whose request deadline passes while it waits is told to retry
	// under the same key (503): nothing of it was recorded.
	late, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if out, err := record(late, "late"); overage.AsError(err).Code != overage.EUNAVAILABLE {
		t.Fatalf("a pending event past its deadline: %v, %v; want EUNAVAILABLE", out, err)
	}
	hangUpLeader()
	g.release()
	r := <-leader
	if r.err != nil || r.out.Status != http.StatusAccepted {
		t.Fatalf("the leader's group after its client hung up: %+v, %v; want it recorded", r.out, r.err)
	}
	if got := b.count(t, "SELECT count(*) FROM usage_logs WHERE id = $1", r.out.UsageLogID); got != 1 {
		t.Fatal("the leader's log was not committed")
	}
	if got := b.count(t, "SELECT count(*) FROM idempotency_keys WHERE idempotency_key IN ('waiter', 'late')"); got != 0 {
		t.Fatal("the event whose client hung up while pending was recorded")
	}
}

// A panic inside a group's transaction answers its members with an error
// and leaves the tenant's queue working.
func TestCoalescedGroupPanicAnswersAndMovesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var once sync.Once
	ingest.SetBeforeWrites(b.svc, func(context.Context) error {
		once.Do(func() { panic("injected") })
		return nil
	})
	requireProblem(t, b.post(t, b.alice.APIKey, "k1", event(1, 1)), http.StatusInternalServerError, "internal")
	requireStatus(t, b.post(t, b.alice.APIKey, "k2", event(1, 1)), http.StatusAccepted)
	requireStatus(t, b.post(t, b.alice.APIKey, "k1", event(1, 1)), http.StatusAccepted)
	if b.logs(t) != 2 || b.records(t) != 2 {
		t.Fatalf("logs/records = %d/%d, want 2/2", b.logs(t), b.records(t))
	}
}
