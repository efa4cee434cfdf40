package overage_test

import (
	"fmt"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
)

// Split bills only what lies above the allowance: an event that crosses
// it is split exactly, and a correction (negative tokens) gives back
// overage before allowance.
func ExampleSplit() {
	const included = 1000
	fmt.Println(overage.Split(0, 800, included))    // inside the allowance
	fmt.Println(overage.Split(800, 500, included))  // crosses it: 300 of 500 over
	fmt.Println(overage.Split(1300, 200, included)) // all over
	fmt.Println(overage.Split(1500, -700, included))
	// Output:
	// 0
	// 300
	// 200
	// -500
}

// Route sends each kind of token to the most specific active meter of
// its type; a kind without a meter goes where its parent goes, so cache
// reads of a model no cache meter matches are billed as input.
func ExampleCatalog_Route() {
	cat := overage.NewCatalog(1, []overage.Meter{
		{Key: overage.MeterInput, EventName: "llm_input_tokens", TokenType: overage.TokenInput, Models: []string{"*"}},
		{Key: overage.MeterOutput, EventName: "llm_output_tokens", TokenType: overage.TokenOutput, Models: []string{"*"}},
		{Key: "claude_cache_read", EventName: "claude_cache_read_tokens", TokenType: overage.TokenCacheRead, Models: []string{"claude-*"}},
	})
	read := int64(1000)
	amounts := overage.Amounts(1200, 350, overage.TokenParts{CacheRead: &read})
	for _, model := range []string{"claude-sonnet-4", "gpt-4o"} {
		fmt.Println(model, cat.Route(model).Lines(amounts))
	}
	// Output:
	// claude-sonnet-4 [{input 200} {output 350} {claude_cache_read 1000}]
	// gpt-4o [{input 1200} {output 350}]
}

// MeterEventKey derives the Stripe Idempotency-Key and meter event
// identifier from the usage log id alone, so every resend of the same
// overage names the same event.
func ExampleMeterEventKey() {
	id := uuid.MustParse("0193a1b2-0000-7000-8000-000000000001")
	fmt.Println(overage.MeterEventKey(id, overage.DimensionInput))
	// Output: usage-log:0193a1b2-0000-7000-8000-000000000001:input
}
