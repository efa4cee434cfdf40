package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/finance"
	"github.com/overage-billing/overage/meters"
)

// createMeters adds meters to the catalog, as `overage meter create` does.
func (b *bundle) createMeters(t *testing.T, ps ...meters.CreateParams) {
	t.Helper()
	store := meters.NewStore(b.pool, overage.DefaultMeterInputEvent, overage.DefaultMeterOutputEvent)
	for _, p := range ps {
		if _, err := store.Create(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
}

// meterLines are a log's meter lines, by meter.
// includeMeters sets the tenant's allowances of the other meters (JSON).
func (b *bundle) includeMeters(t *testing.T, tenant uuid.UUID, included string) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), `UPDATE tenants SET included_meters = $2::jsonb WHERE id = $1`, tenant, included); err != nil {
		t.Fatal(err)
	}
}

func meterLines(t *testing.T, body []byte) map[string]overage.MeterLine {
	t.Helper()
	var l struct {
		Meters []overage.MeterLine `json:"meters"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		t.Fatal(err)
	}
	out := map[string]overage.MeterLine{}
	for _, ln := range l.Meters {
		if _, dup := out[ln.Meter]; dup {
			t.Fatalf("meter %s twice in %s", ln.Meter, body)
		}
		out[ln.Meter] = ln
	}
	return out
}

func partsEvent(model string, in, read, write, out, reasoning int) string {
	return fmt.Sprintf(`{"user_id":"u_1","model_id":%q,"input_tokens":%d,"cache_read_input_tokens":%d,"cache_creation_input_tokens":%d,"output_tokens":%d,"reasoning_output_tokens":%d}`,
		model, in, read, write, out, reasoning)
}

// Each kind of token goes to the most specific active meter of its type;
// a kind without one goes where its parent goes; the answer and the GET
// show one line per meter fed, with the meter's event name, and the
// overage per dimension is the sum of its meters'.
func TestEventsFeedTheMetersTheirModelsRouteTo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Routed before any meter exists: everything on the defaults.
	r := b.post(t, b.alice.APIKey, "before", partsEvent("gpt-4o-mini", 100, 30, 10, 50, 20))
	requireStatus(t, r, http.StatusAccepted)
	lines := meterLines(t, r.body)
	if len(lines) != 2 || lines["input"].Tokens != 100 || lines["output"].Tokens != 50 {
		t.Fatalf("before any meter: lines %+v", lines)
	}
	b.createMeters(t,
		meters.CreateParams{Key: "gpt4o_input", EventName: "gpt4o_input_tokens", TokenType: overage.TokenInput, Models: []string{"gpt-4o*"}},
		meters.CreateParams{Key: "gpt4o_mini_input", EventName: "gpt4o_mini_input_tokens", TokenType: overage.TokenInput, Models: []string{"gpt-4o-mini"}},
		meters.CreateParams{Key: "cache_reads", EventName: "cache_read_tokens", TokenType: overage.TokenCacheRead},
		meters.CreateParams{Key: "o1_reasoning", EventName: "o1_reasoning_tokens", TokenType: overage.TokenReasoning, Models: []string{"o1"}},
	)
	cases := []struct {
		model string
		want  map[string]int64
	}{
		// The exact pattern beats the prefix; cache writes have no meter
		// and go where input goes; reasoning of another model goes where
		// output goes.
		{"gpt-4o-mini", map[string]int64{"input": 0, "output": 50, "gpt4o_mini_input": 70, "cache_reads": 30}},
		{"gpt-4o-2024-08-06", map[string]int64{"input": 0, "output": 50, "gpt4o_input": 70, "cache_reads": 30}},
		{"o1", map[string]int64{"input": 70, "output": 30, "o1_reasoning": 20, "cache_reads": 30}},
		{"claude", map[string]int64{"input": 70, "output": 50, "cache_reads": 30}},
	}
	for i, c := range cases {
		r := b.post(t, b.alice.APIKey, fmt.Sprintf("k%d", i), partsEvent(c.model, 100, 30, 10, 50, 20))
		requireStatus(t, r, http.StatusAccepted)
		lines := meterLines(t, r.body)
		if len(lines) != len(c.want) {
			t.Fatalf("%s: lines %+v, want %v", c.model, lines, c.want)
		}
		for m, n := range c.want {
			if lines[m].Tokens != n || lines[m].Overage != n {
				t.Fatalf("%s: meter %s got %+v, want %d tokens, all overage", c.model, m, lines[m], n)
			}
		}
		if lines["cache_reads"].EventName != "cache_read_tokens" || lines["input"].EventName != overage.DefaultMeterInputEvent {
			t.Fatalf("%s: event names %+v", c.model, lines)
		}
		var l overage.UsageLog
		if err := json.Unmarshal(r.body, &l); err != nil {
			t.Fatal(err)
		}
		if l.Overage.InputTokens != 100 || l.Overage.OutputTokens != 50 {
			t.Fatalf("%s: overage per dimension %+v, want 100/50", c.model, l.Overage)
		}
		// The GET reads back what the answer said.
		g := b.do(t, http.MethodGet, "/v1/usage-events/"+l.ID.String(), b.alice.APIKey, "", "")
		requireStatus(t, g, http.StatusOK)
		if got := meterLines(t, g.body); fmt.Sprint(got) != fmt.Sprint(lines) {
			t.Fatalf("%s: GET lines %v, answer lines %v", c.model, got, lines)
		}
		// And a replay answers byte for byte.
		if rr := b.post(t, b.alice.APIKey, fmt.Sprintf("k%d", i), partsEvent(c.model, 100, 30, 10, 50, 20)); string(rr.body) != string(r.body) {
			t.Fatalf("%s: replay\n%s\nfirst\n%s", c.model, rr.body, r.body)
		}
	}
	// Archived, a meter routes nothing recorded after it.
	if _, err := meters.NewStore(b.pool, "", "").Archive(context.Background(), "cache_reads"); err != nil {
		t.Fatal(err)
	}
	r = b.post(t, b.alice.APIKey, "after-archive", partsEvent("claude", 100, 30, 10, 50, 20))
	requireStatus(t, r, http.StatusAccepted)
	if lines := meterLines(t, r.body); len(lines) != 2 || lines["input"].Tokens != 100 {
		t.Fatalf("after archive: lines %+v, want all input on the default meter", lines)
	}
}

// Concurrent batches of mixed models across allowances on a per-model
// meter and on the default meters: each meter's split is exact, and the
// period totals and finance counters equal the logs' lines.
func TestConcurrentBatchesSplitExactlyPerMeter(t *testing.T) {
	t.Parallel()
	b := setupUnlimited(t)
	b.createMeters(t,
		meters.CreateParams{Key: "gpt4o_input", EventName: "gpt4o_input_tokens", TokenType: overage.TokenInput, Models: []string{"gpt-4o"}},
		meters.CreateParams{Key: "cache_reads", EventName: "cache_read_tokens", TokenType: overage.TokenCacheRead})
	b.includeMeters(t, b.capped.ID, `{"gpt4o_input": 700, "cache_reads": 90}`)
	// 20 batches x 6 events, half gpt-4o, half claude: input 30 with 5
	// cache reads, output 10 each. gpt4o_input gets 60 x 25 = 1500 against
	// 700; input (claude's) 60 x 25 = 1500 against 1000; cache_reads 120 x
	// 5 = 600 against 90; output 120 x 10 = 1200 against 500.
	const n, per = 20, 6
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			evs := make([]string, per)
			for j := range evs {
				model := "gpt-4o"
				if j%2 == 1 {
					model = "claude"
				}
				evs[j] = fmt.Sprintf(`{"request_id":"r%d-%d","user_id":"u","model_id":%q,"input_tokens":30,"cache_read_input_tokens":5,"output_tokens":10}`, i, j, model)
			}
			requireStatus(t, b.postBatch(t, b.capped.APIKey, fmt.Sprintf("b%d", i), batch(evs...)), http.StatusAccepted)
		}()
	}
	wg.Wait()
	want := map[string]int64{"input": 1500 - 1000, "output": 1200 - 500, "gpt4o_input": 1500 - 700, "cache_reads": 600 - 90}
	got := map[string]int64{}
	tokens := map[string]int64{}
	rows, err := b.pool.Query(context.Background(), `
		SELECT 'input', coalesce(overage_input_tokens, input_tokens), 0::bigint
		FROM usage_logs WHERE tenant_id = $1
		UNION ALL SELECT 'output', coalesce(overage_output_tokens, output_tokens), output_tokens FROM usage_logs WHERE tenant_id = $1
		UNION ALL SELECT x.k, x.o, x.t FROM usage_logs, unnest(meter_keys, meter_overage, coalesce(meter_tokens, meter_overage)) AS x (k, o, t) WHERE tenant_id = $1`,
		b.capped.ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		var o, tk int64
		if err := rows.Scan(&k, &o, &tk); err != nil {
			t.Fatal(err)
		}
		got[k] += o
		tokens[k] += tk
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("overage per meter %v, want %v", got, want)
	}
	// The period totals are the logs' tokens per meter.
	var in, out int64
	if err := b.pool.QueryRow(context.Background(), `SELECT coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0)
		FROM allowance_usage WHERE tenant_id = $1`, b.capped.ID).Scan(&in, &out); err != nil {
		t.Fatal(err)
	}
	if in != 1500 || out != 1200 || out != tokens["output"] {
		t.Fatalf("default meters' totals %d/%d, want 1500/1200", in, out)
	}
	for _, k := range []string{"gpt4o_input", "cache_reads"} {
		if tot := b.count(t, `SELECT coalesce(sum(tokens), 0) FROM meter_usage WHERE tenant_id = $1 AND meter = $2`, b.capped.ID, k); int64(tot) != tokens[k] {
			t.Fatalf("meter %s total %d, want the logs' %d", k, tot, tokens[k])
		}
		// The finance counters of the meter equal its logs' overage.
		if c := b.count(t, `SELECT coalesce(sum(overage_tokens), 0) FROM period_counters WHERE tenant_id = $1 AND meter = $2`, b.capped.ID, k); int64(c) != want[k] {
			t.Fatalf("meter %s counters %d, want %d", k, c, want[k])
		}
		// The finance statement reads the same: the meter's line, and the
		// dimension sums including it.
		r, err := finance.Status(context.Background(), b.pool, &b.capped.ID)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, m := range r.Tenants[0].Meters {
			if m.Meter == k {
				found = m.OverageTokens == want[k]
			}
		}
		if !found || r.Tenants[0].OverageInputTokens != want["input"]+want["gpt4o_input"]+want["cache_reads"] {
			t.Fatalf("finance for %s: %+v", k, r.Tenants[0].Counters)
		}
		// At most one event straddles the meter's allowance.
		if s := b.count(t, `SELECT count(*) FROM usage_logs, unnest(meter_keys, meter_overage, coalesce(meter_tokens, meter_overage)) AS x (k, o, t)
			WHERE tenant_id = $1 AND x.k = $2 AND x.o BETWEEN 1 AND x.t - 1`, b.capped.ID, k); s > 1 {
			t.Fatalf("%d events straddle the allowance of %s", s, k)
		}
	}
}

// A correction moves every meter's share: voiding a log takes back what it
// put on each meter, and correcting to new totals puts the difference on
// the meters the totals route to.
func TestCorrectionsMoveEachMetersShare(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createMeters(t, meters.CreateParams{Key: "cache_reads", EventName: "cache_read_tokens", TokenType: overage.TokenCacheRead})
	r := b.post(t, b.alice.APIKey, "e1", partsEvent("gpt-4o", 100, 60, 0, 50, 0))
	requireStatus(t, r, http.StatusAccepted)
	var l overage.UsageLog
	if err := json.Unmarshal(r.body, &l); err != nil {
		t.Fatal(err)
	}
	sumPerMeter := func() map[string]int64 {
		t.Helper()
		out := map[string]int64{}
		for _, id := range []string{l.ID.String()} {
			g := b.do(t, http.MethodGet, "/v1/usage-events/"+id, b.alice.APIKey, "", "")
			requireStatus(t, g, http.StatusOK)
			var got struct {
				Meters      []overage.MeterLine `json:"meters"`
				Corrections []struct {
					Meters []overage.MeterLine `json:"meters"`
				} `json:"corrections"`
			}
			if err := json.Unmarshal(g.body, &got); err != nil {
				t.Fatal(err)
			}
			for _, ln := range got.Meters {
				out[ln.Meter] += ln.Overage
			}
			for _, c := range got.Corrections {
				for _, ln := range c.Meters {
					out[ln.Meter] += ln.Overage
				}
			}
		}
		return out
	}
	if got := sumPerMeter(); got["input"] != 40 || got["cache_reads"] != 60 || got["output"] != 50 {
		t.Fatalf("recorded %v", got)
	}
	// 80 input, of which the original's 60 cache reads still fit.
	c := b.do(t, http.MethodPost, "/v1/usage-events/"+l.ID.String()+"/corrections", b.alice.APIKey, "c1",
		`{"input_tokens":80,"output_tokens":50,"reason":"fewer tokens"}`)
	requireStatus(t, c, http.StatusAccepted)
	if got := sumPerMeter(); got["input"] != 20 || got["cache_reads"] != 60 || got["output"] != 50 {
		t.Fatalf("after correcting input to 80: %v, want input 20, cache_reads 60, output 50", got)
	}
	// 40 input: the cache reads are cut to fit.
	c = b.do(t, http.MethodPost, "/v1/usage-events/"+l.ID.String()+"/corrections", b.alice.APIKey, "c2",
		`{"input_tokens":40,"output_tokens":50,"reason":"fewer still"}`)
	requireStatus(t, c, http.StatusAccepted)
	if got := sumPerMeter(); got["input"] != 0 || got["cache_reads"] != 40 || got["output"] != 50 {
		t.Fatalf("after correcting input to 40: %v, want input 0, cache_reads 40, output 50", got)
	}
	// Voided: every meter's share is taken back.
	c = b.do(t, http.MethodPost, "/v1/usage-events/"+l.ID.String()+"/corrections", b.alice.APIKey, "c3",
		`{"input_tokens":0,"output_tokens":0,"reason":"void"}`)
	requireStatus(t, c, http.StatusAccepted)
	if got := sumPerMeter(); got["input"] != 0 || got["cache_reads"] != 0 || got["output"] != 0 {
		t.Fatalf("after voiding: %v, want nothing on any meter", got)
	}
	if tot := b.count(t, `SELECT coalesce(sum(tokens), 0) FROM meter_usage WHERE tenant_id = $1`, b.alice.ID); tot != 0 {
		t.Fatalf("cache_reads period total %d after voiding, want 0", tot)
	}
}

// A stream whose cached input grows: each checkpoint puts on each meter
// its cumulative share less what the stream's logs put there so far, so a
// growing cache share moves tokens from the input meter to the cache
// meter, and after the final checkpoint every meter holds the stream's
// last totals routed — billed once.
func TestStreamsWhoseCacheCountsGrowBillEachMeterItsShare(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createMeters(t, meters.CreateParams{Key: "cache_reads", EventName: "cache_read_tokens", TokenType: overage.TokenCacheRead})
	checkpoint := func(seq int, final bool, in, read, out int) response {
		t.Helper()
		body := fmt.Sprintf(`{"request_id":"stream-1","user_id":"u","model_id":"gpt-4o","input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":%d,"stream":{"sequence":%d,"final":%t}}`,
			in, read, out, seq, final)
		r := b.post(t, b.alice.APIKey, fmt.Sprintf("cp-%d", seq), body)
		if r.status != http.StatusAccepted && r.status != http.StatusOK {
			t.Fatalf("checkpoint %d: %d %s", seq, r.status, r.body)
		}
		return r
	}
	perMeter := func() map[string]int64 {
		t.Helper()
		out := map[string]int64{}
		rows, err := b.pool.Query(context.Background(), `
			SELECT 'output', output_tokens FROM usage_logs WHERE stream_request_id = 'stream-1'
			UNION ALL SELECT x.k, x.t FROM usage_logs, unnest(meter_keys, coalesce(meter_tokens, meter_overage)) AS x (k, t) WHERE stream_request_id = 'stream-1'
			UNION ALL SELECT 'all_input', input_tokens FROM usage_logs WHERE stream_request_id = 'stream-1'`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var k string
			var n int64
			if err := rows.Scan(&k, &n); err != nil {
				t.Fatal(err)
			}
			out[k] += n
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		out["input"] = out["all_input"] - out["cache_reads"]
		delete(out, "all_input")
		return out
	}
	checkpoint(1, false, 100, 0, 10)
	if got := perMeter(); got["input"] != 100 || got["cache_reads"] != 0 || got["output"] != 10 {
		t.Fatalf("after checkpoint 1: %v", got)
	}
	// The cache share grows faster than the input: the input meter gives
	// back 20 while the totals only grow.
	checkpoint(2, false, 150, 70, 20)
	if got := perMeter(); got["input"] != 80 || got["cache_reads"] != 70 || got["output"] != 20 {
		t.Fatalf("after checkpoint 2: %v, want input 80, cache_reads 70, output 20", got)
	}
	// A replayed checkpoint changes nothing.
	checkpoint(2, false, 150, 70, 20)
	checkpoint(3, true, 160, 90, 25)
	if got := perMeter(); got["input"] != 70 || got["cache_reads"] != 90 || got["output"] != 25 {
		t.Fatalf("after the final checkpoint: %v, want input 70, cache_reads 90, output 25", got)
	}
	// The period totals hold the same.
	if n := b.count(t, `SELECT coalesce(sum(tokens), 0) FROM meter_usage WHERE tenant_id = $1 AND meter = 'cache_reads'`, b.alice.ID); n != 90 {
		t.Fatalf("cache_reads period total %d, want 90", n)
	}
	if n := b.count(t, `SELECT coalesce(sum(input_tokens), 0) FROM allowance_usage WHERE tenant_id = $1`, b.alice.ID); n != 70 {
		t.Fatalf("input meter's period total %d, want 70", n)
	}
}

// A correction may give the corrected parts: with the same totals and
// fewer cached tokens it moves tokens from the cache meter to the input
// meter; a part above its total is 422 naming it.
func TestCorrectionWithCorrectedPartsMovesTokensBetweenMeters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createMeters(t, meters.CreateParams{Key: "cache_reads", EventName: "cache_read_tokens", TokenType: overage.TokenCacheRead})
	r := b.post(t, b.alice.APIKey, "e1", partsEvent("gpt-4o", 100, 60, 0, 50, 0))
	requireStatus(t, r, http.StatusAccepted)
	var l overage.UsageLog
	if err := json.Unmarshal(r.body, &l); err != nil {
		t.Fatal(err)
	}
	path := "/v1/usage-events/" + l.ID.String() + "/corrections"
	bad := b.do(t, http.MethodPost, path, b.alice.APIKey, "c0", `{"input_tokens":100,"output_tokens":50,"cache_read_input_tokens":101,"reason":"x"}`)
	requireProblem(t, bad, http.StatusUnprocessableEntity, "validation-failed")
	if !strings.Contains(string(bad.body), `"cache_read_input_tokens"`) {
		t.Fatalf("the problem does not name the part: %s", bad.body)
	}
	c := b.do(t, http.MethodPost, path, b.alice.APIKey, "c1", `{"input_tokens":100,"output_tokens":50,"cache_read_input_tokens":20,"reason":"the cache hit less"}`)
	requireStatus(t, c, http.StatusAccepted)
	lines := meterLines(t, c.body)
	if lines["input"].Tokens != 40 || lines["cache_reads"].Tokens != -40 || lines["input"].Overage != 40 || lines["cache_reads"].Overage != -40 {
		t.Fatalf("correction lines %+v, want input +40 and cache_reads -40", lines)
	}
	// Correcting to what it already is: nothing to correct.
	same := b.do(t, http.MethodPost, path, b.alice.APIKey, "c2", `{"input_tokens":100,"output_tokens":50,"cache_read_input_tokens":20,"reason":"again"}`)
	requireProblem(t, same, http.StatusUnprocessableEntity, "validation-failed")
}

// Events a per-model catalog routes away from both default meters feed
// them nothing, so the tenant's allowance on the defaults, not reached,
// orders none of them: concurrent events charge the transactions' slot
// rows (no period lock, no slot 0), every token is overage on the model's
// meters, and the defaults' allowance is left whole for the events that
// do feed them.
func TestEventsThatFeedNoDefaultMeterNeedNoOrderForItsAllowance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createMeters(t,
		meters.CreateParams{Key: "m_input", EventName: "m_input_tokens", TokenType: overage.TokenInput, Models: []string{"gpt-4o"}},
		meters.CreateParams{Key: "m_cache", EventName: "m_cache_read_tokens", TokenType: overage.TokenCacheRead, Models: []string{"gpt-4o"}},
		meters.CreateParams{Key: "m_output", EventName: "m_output_tokens", TokenType: overage.TokenOutput, Models: []string{"gpt-4o"}},
	)
	const n = 30
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r := b.post(t, b.capped.APIKey, fmt.Sprintf("m%d", i), partsEvent("gpt-4o", 100, 30, 0, 50, 0))
			requireStatus(t, r, http.StatusAccepted)
			lines := meterLines(t, r.body)
			if lines["m_input"].Overage != 70 || lines["m_cache"].Overage != 30 || lines["m_output"].Overage != 50 ||
				lines["input"].Tokens != 0 || lines["output"].Tokens != 0 {
				t.Errorf("lines %+v, want all overage on the model's meters, nothing on the defaults", lines)
			}
		}()
	}
	close(start)
	wg.Wait()
	if c := b.count(t, `SELECT (SELECT count(*) FROM allowance_usage WHERE tenant_id = $1 AND slot = 0)
		+ (SELECT count(*) FROM meter_usage WHERE tenant_id = $1 AND slot = 0)`, b.capped.ID); c != 0 {
		t.Fatalf("%d rows of the ordered slot: events feeding no default meter were ordered for its allowance", c)
	}
	if c := b.count(t, `SELECT coalesce(sum(tokens), 0) FROM meter_usage WHERE tenant_id = $1`, b.capped.ID); c != n*150 {
		t.Fatalf("meter totals %d, want %d", c, n*150)
	}
	// Nothing was added to the defaults' totals, so no row of theirs was
	// written.
	if c := b.count(t, `SELECT count(*) FROM allowance_usage WHERE tenant_id = $1`, b.capped.ID); c != 0 {
		t.Fatalf("%d rows of the default meters' totals, want none: the events gave them no tokens", c)
	}
	// The defaults' allowance is untouched: an event of another model
	// falls within it, and its tokens are counted.
	r := b.post(t, b.capped.APIKey, "other", partsEvent("claude-3", 130, 0, 0, 40, 0))
	requireStatus(t, r, http.StatusAccepted)
	if lines := meterLines(t, r.body); lines["input"].Tokens != 130 || lines["input"].Overage != 0 || lines["output"].Overage != 0 {
		t.Fatalf("an event of the defaults: lines %+v, want within the allowance", lines)
	}
	if c := b.count(t, `SELECT sum(input_tokens) * 1000 + sum(output_tokens) FROM allowance_usage WHERE tenant_id = $1`, b.capped.ID); c != 130*1000+40 {
		t.Fatalf("default meters' totals %d, want 130 and 40", c)
	}
}

// The totals of the other meters are read for the tenant's subscription
// period an event falls in, not only calendar months: once a meter's
// allowance is used up in that period, the next batch there charges it
// without ordering (the transaction's slot, not slot 0), all overage.
func TestMeterTotalsOfASubscriptionPeriodSpareTheOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.createMeters(t, meters.CreateParams{Key: "m_input", EventName: "m_input_tokens", TokenType: overage.TokenInput, Models: []string{"gpt-4o"}})
	now := time.Now().UTC()
	start := now.Add(-2 * time.Hour).Truncate(time.Microsecond)
	if _, err := b.pool.Exec(ctx, `INSERT INTO tenant_subscriptions
		(tenant_id, stripe_subscription_id, status, current_period_start, current_period_end, event_created)
		VALUES ($1, 'sub_1', 'active', $2, $3, now())`, b.capped.ID, start, now.Add(30*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	b.includeMeters(t, b.capped.ID, `{"m_input": 1000}`)
	at := func(rid string, in int) string {
		return fmt.Sprintf(`{"request_id":%q,"timestamp":%q,"user_id":"u","model_id":"gpt-4o","input_tokens":%d,"output_tokens":0}`,
			rid, now.Add(-time.Hour).Format(time.RFC3339Nano), in)
	}
	requireStatus(t, b.postBatch(t, b.capped.APIKey, "k1", batch(at("a", 1500))), http.StatusAccepted)
	r := b.postBatch(t, b.capped.APIKey, "k2", batch(at("b", 100), at("c", 200)))
	requireStatus(t, r, http.StatusAccepted)
	for i, e := range batchEvents(t, r) {
		for _, ln := range e["meters"].([]any) {
			if l := ln.(map[string]any); l["meter"] == "m_input" && l["overage"] != l["tokens"] {
				t.Fatalf("event %d: %v, want all overage", i, l)
			}
		}
	}
	if c := b.count(t, `SELECT count(*) FROM meter_usage WHERE tenant_id = $1 AND period_start = $2 AND slot > 0`, b.capped.ID, start); c == 0 {
		t.Fatal("the batch past the meter's allowance was ordered: its period's total was not read")
	}
	if c := b.count(t, `SELECT coalesce(sum(tokens), 0) FROM meter_usage WHERE tenant_id = $1 AND period_start = $2`, b.capped.ID, start); c != 1800 {
		t.Fatalf("the subscription period's total %d, want 1800", c)
	}
}

// A batch whose events fall in two calendar months reads the meters'
// totals of both (the months computed in serve): the month whose total
// has reached the meter's allowance is charged without ordering (its
// total row in the transaction's slot), the one with allowance left is
// ordered (slot 0) and split there.
func TestMeterTotalsOfEveryMonthOfABatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createMeters(t, meters.CreateParams{Key: "m_input", EventName: "m_input_tokens", TokenType: overage.TokenInput, Models: []string{"gpt-4o"}})
	b.includeMeters(t, b.capped.ID, `{"m_input": 1000}`)
	now := time.Now().UTC().Truncate(time.Microsecond)
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	last := month.AddDate(0, -1, 0)
	at := func(rid string, ts time.Time, in int) string {
		return fmt.Sprintf(`{"request_id":%q,"timestamp":%q,"user_id":"u","model_id":"gpt-4o","input_tokens":%d,"output_tokens":0}`,
			rid, ts.Format(time.RFC3339Nano), in)
	}
	requireStatus(t, b.postBatch(t, b.capped.APIKey, "k1", batch(at("a", month.Add(-time.Hour), 1500))), http.StatusAccepted)
	r := b.postBatch(t, b.capped.APIKey, "k2", batch(at("b", now, 600), at("c", month.Add(-time.Hour), 200), at("d", now, 600)))
	requireStatus(t, r, http.StatusAccepted)
	want := []int64{0, 200, 200} // this month: 1,000 included; last month's used up
	for i, e := range batchEvents(t, r) {
		for _, ln := range e["meters"].([]any) {
			if l := ln.(map[string]any); l["meter"] == "m_input" && int64(l["overage"].(float64)) != want[i] {
				t.Fatalf("event %d: %v, want overage %d", i, l, want[i])
			}
		}
	}
	if c := b.count(t, `SELECT count(*) FROM meter_usage WHERE tenant_id = $1 AND period_start = $2 AND slot > 0`, b.capped.ID, last); c == 0 {
		t.Fatal("last month, past the meter's allowance, was ordered: its total was not read")
	}
	if c := b.count(t, `SELECT count(*) FROM meter_usage WHERE tenant_id = $1 AND period_start = $2 AND slot > 0`, b.capped.ID, month); c != 0 {
		t.Fatal("this month, with allowance left, was not ordered")
	}
}

// A log whose every line is wholly overage stores its tokens once
// (meter_tokens NULL, read back as meter_overage); a log with a line
// partly within an allowance keeps both arrays. Either reads back, answers,
// replays and rolls up with its own tokens.
func TestALogWhollyInOverageStoresItsMeterTokensOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createMeters(t,
		meters.CreateParams{Key: "gpt4o_input", EventName: "gpt4o_input_tokens", TokenType: overage.TokenInput, Models: []string{"gpt-4o"}},
		meters.CreateParams{Key: "cache_reads", EventName: "cache_read_tokens", TokenType: overage.TokenCacheRead})
	b.includeMeters(t, b.capped.ID, `{"gpt4o_input": 50}`)
	// 70 fresh input against 50 included: the first log splits; the
	// second is wholly overage.
	first := b.post(t, b.capped.APIKey, "first", partsEvent("gpt-4o", 100, 30, 0, 0, 0))
	requireStatus(t, first, http.StatusAccepted)
	second := b.post(t, b.capped.APIKey, "second", partsEvent("gpt-4o", 100, 30, 0, 0, 0))
	requireStatus(t, second, http.StatusAccepted)
	for _, c := range []struct {
		r       response
		stored  bool // meter_tokens stored as an array
		overage int64
		cacheOv int64
	}{{first, true, 20, 30}, {second, false, 70, 30}} {
		var l overage.UsageLog
		if err := json.Unmarshal(c.r.body, &l); err != nil {
			t.Fatal(err)
		}
		var stored bool
		if err := b.pool.QueryRow(context.Background(), `SELECT meter_tokens IS NOT NULL FROM usage_logs WHERE id = $1`, l.ID).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if stored != c.stored {
			t.Fatalf("log %s: meter_tokens stored %v, want %v", l.ID, stored, c.stored)
		}
		lines := meterLines(t, c.r.body)
		if in := lines["gpt4o_input"]; in.Tokens != 70 || in.Overage != c.overage || lines["cache_reads"].Tokens != 30 || lines["cache_reads"].Overage != c.cacheOv {
			t.Fatalf("log %s: lines %+v", l.ID, lines)
		}
		g := b.do(t, http.MethodGet, "/v1/usage-events/"+l.ID.String(), b.capped.APIKey, "", "")
		requireStatus(t, g, http.StatusOK)
		if got := meterLines(t, g.body); fmt.Sprint(got) != fmt.Sprint(lines) {
			t.Fatalf("log %s: GET lines %v, answer lines %v", l.ID, got, lines)
		}
	}
	if rr := b.post(t, b.capped.APIKey, "second", partsEvent("gpt-4o", 100, 30, 0, 0, 0)); string(rr.body) != string(second.body) {
		t.Fatalf("replay\n%s\nfirst\n%s", rr.body, second.body)
	}
}

// A default meter's overage equal to the log's tokens (wholly overage, as
// every log is once the allowance is spent) is stored NULL; an overage
// partly within the allowance, or none, is stored as it is. Either reads
// back, in the answer, the GET, the replay and the finance counters, with
// its own value.
func TestAnOverageEqualToItsTokensIsStoredOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// capped includes 1,000 input and 500 output tokens.
	steps := []struct {
		in, out         int
		overIn, overOut int64
		nullIn, nullOut bool
	}{
		{600, 100, 0, 0, false, false},    // within both allowances
		{600, 100, 200, 0, false, false},  // input crosses its allowance
		{700, 500, 700, 200, true, false}, // input wholly overage, output crosses
		{50, 20, 50, 20, true, true},      // both wholly overage
	}
	var wantIn, wantOut int64
	for i, s := range steps {
		key := fmt.Sprintf("step-%d", i)
		r := b.post(t, b.capped.APIKey, key, event(s.in, s.out))
		requireStatus(t, r, http.StatusAccepted)
		var l overage.UsageLog
		if err := json.Unmarshal(r.body, &l); err != nil {
			t.Fatal(err)
		}
		if l.Overage.InputTokens != s.overIn || l.Overage.OutputTokens != s.overOut {
			t.Fatalf("step %d: answer overage %+v, want %d/%d", i, l.Overage, s.overIn, s.overOut)
		}
		var nullIn, nullOut bool
		if err := b.pool.QueryRow(context.Background(), `SELECT overage_input_tokens IS NULL, overage_output_tokens IS NULL
			FROM usage_logs WHERE id = $1`, l.ID).Scan(&nullIn, &nullOut); err != nil {
			t.Fatal(err)
		}
		if nullIn != s.nullIn || nullOut != s.nullOut {
			t.Fatalf("step %d: stored NULL input %v output %v, want %v %v", i, nullIn, nullOut, s.nullIn, s.nullOut)
		}
		g := b.do(t, http.MethodGet, "/v1/usage-events/"+l.ID.String(), b.capped.APIKey, "", "")
		requireStatus(t, g, http.StatusOK)
		var got overage.UsageLog
		if err := json.Unmarshal(g.body, &got); err != nil {
			t.Fatal(err)
		}
		if got.Overage != l.Overage {
			t.Fatalf("step %d: GET overage %+v, answer %+v", i, got.Overage, l.Overage)
		}
		if rr := b.post(t, b.capped.APIKey, key, event(s.in, s.out)); string(rr.body) != string(r.body) {
			t.Fatalf("step %d: replay\n%s\nfirst\n%s", i, rr.body, r.body)
		}
		wantIn, wantOut = wantIn+s.overIn, wantOut+s.overOut
	}
	var in, out int64
	if err := b.pool.QueryRow(context.Background(), `SELECT sum(overage_input_tokens)::bigint, sum(overage_output_tokens)::bigint
		FROM billing_counters WHERE tenant_id = $1`, b.capped.ID).Scan(&in, &out); err != nil {
		t.Fatal(err)
	}
	if in != wantIn || out != wantOut {
		t.Fatalf("billing_counters: overage %d/%d, want %d/%d", in, out, wantIn, wantOut)
	}
}
