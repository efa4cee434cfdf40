package overage_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/overage-billing/overage"
)

func meter(key string, t overage.TokenType, models ...string) overage.Meter {
	return overage.Meter{Key: key, EventName: "evt_" + key, TokenType: t, Models: models}
}

// defaults are the two meters every catalog has.
func defaults() []overage.Meter {
	return []overage.Meter{
		meter(overage.MeterInput, overage.TokenInput, "*"),
		meter(overage.MeterOutput, overage.TokenOutput, "*"),
	}
}

// routing spells a Routing by token type, so a failing case reads as the
// contract does.
func routing(r overage.Routing) map[overage.TokenType]string {
	out := map[overage.TokenType]string{}
	for i, t := range overage.TokenTypes {
		out[t] = r[i]
	}
	return out
}

// TestCatalogRoute is the routing rule of the contract's "Meters": per
// kind of token, the active meter of that type whose pattern matches most
// specifically (exact, then the longest prefix, then *); a kind without
// one goes where its parent goes for that model; archived meters route
// nothing; no token is ever left without a meter.
func TestCatalogRoute(t *testing.T) {
	t.Parallel()
	archived := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	gone := meter("gpt4o_gone", overage.TokenInput, "gpt-4o")
	gone.ArchivedAt = &archived
	goneRead := meter("read_gone", overage.TokenCacheRead, "*")
	goneRead.ArchivedAt = &archived
	catalog := append(defaults(),
		meter("gpt_in", overage.TokenInput, "gpt-*"),
		meter("gpt4_in", overage.TokenInput, "gpt-4*"),
		meter("gpt4o_in", overage.TokenInput, "gpt-4o"),
		meter("mini_out", overage.TokenOutput, "gpt-4o-mini", "o3-mini"),
		meter("claude_read", overage.TokenCacheRead, "claude-*"),
		meter("any_write", overage.TokenCacheWrite, "*"),
		meter("o_reason", overage.TokenReasoning, "o*"),
		gone, goneRead,
	)
	c := overage.NewCatalog(7, catalog)

	in, out := overage.MeterInput, overage.MeterOutput
	for _, tc := range []struct {
		name, model string
		// want per type: input, cache_read, cache_write, output, reasoning
		want [overage.NumTokenTypes]string
	}{
		{"exact beats every prefix and *", "gpt-4o", [5]string{"gpt4o_in", "gpt4o_in", "any_write", out, out}},
		{"the longer prefix beats the shorter", "gpt-4-turbo", [5]string{"gpt4_in", "gpt4_in", "any_write", out, out}},
		{"a prefix beats *", "gpt-3.5-turbo", [5]string{"gpt_in", "gpt_in", "any_write", out, out}},
		{"an exact id is not a prefix", "gpt-4o-2024-08-06", [5]string{"gpt4_in", "gpt4_in", "any_write", out, out}},
		{"exact on output; reasoning follows output, then its own prefix", "o3-mini",
			[5]string{in, in, "any_write", "mini_out", "o_reason"}},
		{"a second exact pattern of one meter; reasoning follows it", "gpt-4o-mini", [5]string{"gpt4_in", "gpt4_in", "any_write", "mini_out", "mini_out"}},
		{"cache_read's own meter; no input meter but the default", "claude-3-5-sonnet",
			[5]string{in, "claude_read", "any_write", out, out}},
		{"nothing but defaults and *", "llama-3", [5]string{in, in, "any_write", out, out}},
		{"the empty model id", "", [5]string{in, in, "any_write", out, out}},
		{"prefix matching is case-sensitive", "GPT-4o", [5]string{in, in, "any_write", out, out}},
	} {
		got := c.Route(tc.model)
		if got != overage.Routing(tc.want) {
			t.Errorf("%s: Route(%q) = %v, want %v", tc.name, tc.model, routing(got), routing(overage.Routing(tc.want)))
		}
	}

	// An archived meter routes nothing, yet the catalog still knows it: a
	// log that fed it names it as long as it is kept.
	for _, model := range []string{"gpt-4o", "anything"} {
		r := routing(c.Route(model))
		for _, k := range r {
			if k == gone.Key || k == goneRead.Key {
				t.Errorf("Route(%q) = %v: an archived meter routes", model, r)
			}
		}
	}
	if m, ok := c.Meter(gone.Key); !ok || m.ArchivedAt == nil || m.EventName != "evt_gpt4o_gone" {
		t.Errorf("Meter(%q) = %+v, %v; want the archived meter", gone.Key, m, ok)
	}
	if c.Version != 7 || len(c.Meters()) != len(catalog) || !c.Extra() {
		t.Errorf("Version %d, %d meters, Extra %v", c.Version, len(c.Meters()), c.Extra())
	}
}

// TestCatalogRouteFallsBackToParent: the parts of input follow input and
// reasoning follows output for the same model, a per-model parent meter
// included; with the defaults alone every token goes to input or output,
// as before meters.
func TestCatalogRouteFallsBackToParent(t *testing.T) {
	t.Parallel()
	only := overage.NewCatalog(1, defaults())
	want := overage.Routing{overage.MeterInput, overage.MeterInput, overage.MeterInput, overage.MeterOutput, overage.MeterOutput}
	for _, model := range []string{"gpt-4o", "claude-3-opus", ""} {
		if got := only.Route(model); got != want {
			t.Errorf("defaults only: Route(%q) = %v, want %v", model, routing(got), routing(want))
		}
	}
	if only.Extra() {
		t.Error("a catalog of the defaults alone reports extra meters")
	}

	c := overage.NewCatalog(2, append(defaults(),
		meter("opus_in", overage.TokenInput, "claude-3-opus"),
		meter("opus_out", overage.TokenOutput, "claude-3-opus"),
		meter("sonnet_read", overage.TokenCacheRead, "claude-3-5-sonnet"),
	))
	got := routing(c.Route("claude-3-opus"))
	for typ, m := range map[overage.TokenType]string{
		overage.TokenInput: "opus_in", overage.TokenCacheRead: "opus_in", overage.TokenCacheWrite: "opus_in",
		overage.TokenOutput: "opus_out", overage.TokenReasoning: "opus_out",
	} {
		if got[typ] != m {
			t.Errorf("claude-3-opus: %s goes to %q, want its parent's per-model meter %q (routing %v)", typ, got[typ], m, got)
		}
	}
	got = routing(c.Route("claude-3-5-sonnet"))
	if got[overage.TokenCacheRead] != "sonnet_read" || got[overage.TokenCacheWrite] != overage.MeterInput {
		t.Errorf("claude-3-5-sonnet: %v; want cache_read on sonnet_read, cache_write on input", got)
	}

	// A catalog that lost its defaults (never in the database; a bug, say)
	// still bills every token on the default keys.
	empty := overage.NewCatalog(0, nil)
	if got := empty.Route("x"); got != want {
		t.Errorf("empty catalog: Route = %v, want %v", routing(got), routing(want))
	}
}

// TestNewCatalogCopiesItsMeters: the catalog is shared by every request
// that routes with it; the slice it was built from may be reused.
func TestNewCatalogCopiesItsMeters(t *testing.T) {
	t.Parallel()
	ms := append(defaults(), meter("a", overage.TokenCacheRead, "gpt-*"))
	c := overage.NewCatalog(1, ms)
	ms[2].Key, ms[2].Models[0], ms[2].TokenType = "b", "claude-*", overage.TokenOutput
	if got := routing(c.Route("gpt-4o"))[overage.TokenCacheRead]; got != "a" {
		t.Errorf("after the caller changed its slice, gpt-4o's cache reads go to %q, want a", got)
	}
	if m, ok := c.Meter("a"); !ok || m.Models[0] != "gpt-*" {
		t.Errorf("Meter(a) = %+v, %v", m, ok)
	}
}

// TestSplit is the overage rule at an allowance: below it nothing is
// overage, an event crossing it is split exactly, above it every token
// is; a negative change gives back overage first, then allowance.
func TestSplit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                     string
		before, tokens, included int64
		want                     int64
	}{
		{"below", 0, 40, 100, 0},
		{"up to the allowance exactly", 60, 40, 100, 0},
		{"crossing", 80, 50, 100, 30},
		{"from exactly the allowance", 100, 5, 100, 5},
		{"above", 150, 20, 100, 20},
		{"no allowance", 0, 7, 0, 7},
		{"zero tokens above", 150, 0, 100, 0},
		{"correction above: overage back", 150, -20, 100, -20},
		{"correction crossing back: overage, then allowance", 130, -50, 100, -30},
		{"correction below: allowance back only", 90, -50, 100, 0},
		{"correction of everything", 130, -130, 100, -30},
		{"correction from exactly the allowance", 100, -10, 100, 0},
	} {
		if got := overage.Split(tc.before, tc.tokens, tc.included); got != tc.want {
			t.Errorf("%s: Split(%d, %d, %d) = %d, want %d", tc.name, tc.before, tc.tokens, tc.included, got, tc.want)
		}
	}
	// Split adds up: the overage of a period is the same however its
	// events and corrections are cut, and never more than its tokens.
	for _, included := range []int64{0, 1, 50, 99, 100, 1000} {
		var before, sum int64
		for i, tokens := range []int64{30, 0, 45, -20, 70, 1, -90, 64} {
			o := overage.Split(before, tokens, included)
			if o > max(tokens, 0) || o < min(tokens, 0) {
				t.Errorf("included %d, step %d: overage %d of %d tokens", included, i, o, tokens)
			}
			before += tokens
			sum += o
		}
		if want := max(0, before-included); sum != want {
			t.Errorf("included %d: the overage adds up to %d, want max(0, %d-%d) = %d", included, sum, before, included, want)
		}
	}
}

// TestRoutingLines: the default lines first, always both; every other
// meter once, its kinds merged.
func TestRoutingLines(t *testing.T) {
	t.Parallel()
	c := overage.NewCatalog(1, append(defaults(),
		meter("gpt_in", overage.TokenInput, "gpt-4o"), meter("gpt_read", overage.TokenCacheRead, "gpt-4o")))
	r := c.Route("gpt-4o")
	amounts := overage.Amounts(100, 30, overage.TokenParts{CacheRead: ptr(40), CacheWrite: ptr(10), Reasoning: ptr(5)})
	if amounts != [5]int64{50, 40, 10, 25, 5} {
		t.Fatalf("Amounts = %v", amounts)
	}
	got := fmt.Sprint(r.Lines(amounts))
	if want := "[{input 0} {output 30} {gpt_in 60} {gpt_read 40}]"; got != want {
		t.Errorf("Lines = %s, want %s", got, want)
	}
	// Appended to a buffer holding another event's lines, the same lines
	// after them, that event's left as they were.
	buf := r.Lines(amounts)
	if got := fmt.Sprint(r.AppendLines(buf, amounts)); got != "[{input 0} {output 30} {gpt_in 60} {gpt_read 40} {input 0} {output 30} {gpt_in 60} {gpt_read 40}]" {
		t.Errorf("AppendLines = %s", got)
	}
	if got := fmt.Sprint(c.Route("claude").AppendLines(buf[:1], amounts)); got != "[{input 0} {input 100} {output 30}]" {
		t.Errorf("AppendLines after one line = %s", got)
	}
}

func ptr(n int64) *int64 { return &n }
