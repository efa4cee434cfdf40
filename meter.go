package overage

import (
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
)

// TokenType is a kind of token a meter counts. Input and output are the
// event's totals less their parts: cache reads and writes are parts of
// input, reasoning is part of output.
type TokenType string

const (
	TokenInput      TokenType = "input"
	TokenCacheRead  TokenType = "cache_read"
	TokenCacheWrite TokenType = "cache_write"
	TokenOutput     TokenType = "output"
	TokenReasoning  TokenType = "reasoning"
)

// TokenTypes lists every token type in the order lines are shown.
var TokenTypes = [NumTokenTypes]TokenType{TokenInput, TokenCacheRead, TokenCacheWrite, TokenOutput, TokenReasoning}

// NumTokenTypes is how many token types there are.
const NumTokenTypes = 5

// Valid reports whether t is a token type.
func (t TokenType) Valid() bool {
	for _, x := range TokenTypes {
		if t == x {
			return true
		}
	}
	return false
}

// Parent is the token type whose routing a kind without a meter of its own
// falls back to: input for cache reads and writes, output for reasoning.
func (t TokenType) Parent() TokenType {
	switch t {
	case TokenCacheRead, TokenCacheWrite:
		return TokenInput
	case TokenReasoning:
		return TokenOutput
	}
	return t
}

// Dimension is the parent dimension (input or output) the type's tokens
// are part of.
func (t TokenType) Dimension() Dimension {
	if t.Parent() == TokenOutput {
		return DimensionOutput
	}
	return DimensionInput
}

// The two default meters: they always exist, count every token of their
// dimension that no other meter takes, and keep the key they always had.
const (
	MeterInput  = "input"
	MeterOutput = "output"
)

// IsDefaultMeter reports whether key is one of the two default meters.
func IsDefaultMeter(key string) bool { return key == MeterInput || key == MeterOutput }

// Meter is one Stripe Billing Meter overage reports to, and the tokens it
// counts: one token type, of the models its patterns match.
type Meter struct {
	Key        string     `json:"key"`
	EventName  string     `json:"event_name"`
	TokenType  TokenType  `json:"token_type"`
	Models     []string   `json:"models"`
	ArchivedAt *time.Time `json:"archived_at"`
	CreatedAt  time.Time  `json:"created_at"`
}

var meterKeyPattern = regexp.MustCompile(`^[a-z0-9_]{1,40}$`)

// ValidMeterKey reports whether key is a meter key: [a-z0-9_]{1,40}.
func ValidMeterKey(key string) bool { return meterKeyPattern.MatchString(key) }

// ValidModelPattern reports whether p is a model pattern: a model id, a
// prefix ending in '*', or '*'. A '*' anywhere but at the end is refused,
// so a pattern means one thing.
func ValidModelPattern(p string) bool {
	if p == "" || len(p) > 200 {
		return false
	}
	i := strings.IndexByte(p, '*')
	return i < 0 || i == len(p)-1
}

// Catalog is the meters usage is routed to: the active ones, and every
// meter ever created by key (a log names the meters it fed for as long as
// it is kept; archived ones included).
type Catalog struct {
	// Version is the database's meter_catalog.version this was read at.
	Version int64
	all     map[string]*Meter
	// active per token type, most specific pattern first.
	routes [NumTokenTypes][]route
}

type route struct {
	pattern string
	meter   string
}

// NewCatalog builds a catalog of meters (active and archived).
func NewCatalog(version int64, meters []Meter) *Catalog {
	c := &Catalog{Version: version, all: make(map[string]*Meter, len(meters))}
	for i := range meters {
		// A copy: the catalog is shared by every request routing with it,
		// so it must not change when the caller reuses its slice.
		cp := meters[i]
		cp.Models = append([]string(nil), cp.Models...)
		m := &cp
		c.all[m.Key] = m
		if m.ArchivedAt != nil {
			continue
		}
		t := tokenIndex(m.TokenType)
		if t < 0 {
			continue
		}
		for _, p := range m.Models {
			c.routes[t] = append(c.routes[t], route{pattern: p, meter: m.Key})
		}
	}
	for t := range c.routes {
		sort.SliceStable(c.routes[t], func(i, j int) bool {
			return specificity(c.routes[t][i].pattern) > specificity(c.routes[t][j].pattern)
		})
	}
	return c
}

// specificity orders patterns: an exact id beats any prefix, a longer
// prefix beats a shorter one, and '*' comes last.
func specificity(p string) int {
	if !strings.HasSuffix(p, "*") {
		return 1 << 20
	}
	return len(p) - 1
}

func matches(p, model string) bool {
	if strings.HasSuffix(p, "*") {
		return strings.HasPrefix(model, p[:len(p)-1])
	}
	return p == model
}

func tokenIndex(t TokenType) int {
	for i, x := range TokenTypes {
		if x == t {
			return i
		}
	}
	return -1
}

// Meter returns the meter of key, archived or not.
func (c *Catalog) Meter(key string) (*Meter, bool) {
	m, ok := c.all[key]
	return m, ok
}

// Meters lists every meter, by key.
func (c *Catalog) Meters() []Meter {
	out := make([]Meter, 0, len(c.all))
	for _, m := range c.all {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Extra reports whether the catalog has any active meter but the defaults:
// without one, every event routes to the defaults and needs no routing.
func (c *Catalog) Extra() bool {
	for _, rs := range c.routes {
		for _, r := range rs {
			if !IsDefaultMeter(r.meter) {
				return true
			}
		}
	}
	return false
}

// Routing is, per token type (in TokenTypes order), the key of the meter
// its tokens go to.
type Routing [NumTokenTypes]string

// Route decides the meter of each kind of token of an event of model: the
// active meter of that token type whose pattern matches most specifically
// (exact, then the longest prefix, then '*'); a kind with no such meter
// goes where its parent goes, and input and output always have the
// default meters. So no token is ever left unbilled.
func (c *Catalog) Route(model string) Routing {
	var r Routing
	for i, t := range TokenTypes {
		r[i] = ""
		for _, rt := range c.routes[i] {
			if matches(rt.pattern, model) {
				r[i] = rt.meter
				break
			}
		}
		if r[i] == "" && t.Parent() != t {
			r[i] = r[tokenIndex(t.Parent())]
		}
		if r[i] == "" {
			r[i] = MeterInput
			if t.Dimension() == DimensionOutput {
				r[i] = MeterOutput
			}
		}
	}
	return r
}

// Amounts splits an event's totals into its kinds of tokens, in
// TokenTypes order: input less cache reads and writes, the cache reads,
// the cache writes, output less reasoning, the reasoning.
func Amounts(inputTokens, outputTokens int64, p TokenParts) [NumTokenTypes]int64 {
	var read, write, reasoning int64
	if p.CacheRead != nil {
		read = *p.CacheRead
	}
	if p.CacheWrite != nil {
		write = *p.CacheWrite
	}
	if p.Reasoning != nil {
		reasoning = *p.Reasoning
	}
	return [NumTokenTypes]int64{inputTokens - read - write, read, write, outputTokens - reasoning, reasoning}
}

// MeterTokens is a number of tokens on one meter.
type MeterTokens struct {
	Meter  string
	Tokens int64
}

// Lines merges an event's amounts by the meter they route to: the default
// meters first (always both, so a log of the defaults reads as before),
// then every other meter fed, in token type order.
func (r Routing) Lines(amounts [NumTokenTypes]int64) []MeterTokens {
	// Room for every line at once: growing from the two defaults took
	// three allocations an event of three meters.
	out := make([]MeterTokens, 2, 2+NumTokenTypes)
	out[0].Meter, out[1].Meter = MeterInput, MeterOutput
	for i, m := range r {
		switch m {
		case MeterInput:
			out[0].Tokens += amounts[i]
			continue
		case MeterOutput:
			out[1].Tokens += amounts[i]
			continue
		}
		found := false
		for j := range out {
			if out[j].Meter == m {
				out[j].Tokens += amounts[i]
				found = true
				break
			}
		}
		if !found {
			out = append(out, MeterTokens{Meter: m, Tokens: amounts[i]})
		}
	}
	return out
}

// Split is the overage rule: of tokens added to a meter's period total
// that stood at before, the part above the allowance included,
// max(0, before+tokens-included) - max(0, before-included). An event that
// crosses the allowance is split exactly; a negative change (a correction)
// gives back overage first, then allowance.
func Split(before, tokens, included int64) int64 {
	return max(0, before+tokens-included) - max(0, before-included)
}

// MeterLine is what a usage log fed one meter: its tokens, their overage,
// and the meter event that carries the overage (Identifier nil until the
// log joins a report).
type MeterLine struct {
	Meter      string     `json:"meter"`
	EventName  string     `json:"event_name"`
	Tokens     int64      `json:"tokens"`
	Overage    int64      `json:"overage"`
	Identifier *string    `json:"identifier"`
	AcceptedAt *time.Time `json:"accepted_at"`
	// Lead is the lead log of the line's report, nil until it has one.
	Lead *uuid.UUID `json:"-"`
}

// Present completes the meter lines of a log as its row holds them: the
// two default lines first, holding their dimension's whole tokens (the
// row's input_tokens and output_tokens) and their own overage, then the
// lines of the other meters. It takes the other meters' tokens out of
// their dimension's default line, names each line's meter event and
// identifier, and sets Overage to the sums per dimension. Every meter the
// lines name must be in the catalog.
func (c *Catalog) Present(l *UsageLog) {
	var dims Overage
	n := 0 // lines with overage: the meter events
	for i := range l.Meters {
		ln := &l.Meters[i]
		if ln.Overage != 0 {
			n++
		}
		m, ok := c.all[ln.Meter]
		if ok {
			ln.EventName = m.EventName
		}
		if i >= 2 && ok {
			if m.TokenType.Dimension() == DimensionOutput {
				l.Meters[1].Tokens -= ln.Tokens
			} else {
				l.Meters[0].Tokens -= ln.Tokens
			}
		}
		if ln.Lead != nil {
			key := MeterEventKey(*ln.Lead, Dimension(ln.Meter))
			ln.Identifier = &key
		}
		if ok && m.TokenType.Dimension() == DimensionOutput {
			dims.OutputTokens += ln.Overage
		} else {
			dims.InputTokens += ln.Overage
		}
	}
	l.Overage = dims
	// One allocation for the events, not one per doubling.
	l.StripeEvents = l.StripeEvents[:0]
	if cap(l.StripeEvents) < n {
		l.StripeEvents = make([]StripeEvent, 0, n)
	}
	for _, ln := range l.Meters {
		if ln.Overage != 0 {
			l.StripeEvents = append(l.StripeEvents, StripeEvent{Dimension: Dimension(ln.Meter), Identifier: ln.Identifier,
				Value: ln.Overage, AcceptedAt: ln.AcceptedAt})
		}
	}
	if len(l.StripeEvents) == 0 {
		l.StripeEvents = nil
	}
}

// ExtraKeys lists the meters of lines beyond the defaults.
func ExtraKeys(lines []MeterLine) []string {
	var out []string
	for _, ln := range lines[min(2, len(lines)):] {
		out = append(out, ln.Meter)
	}
	return out
}
