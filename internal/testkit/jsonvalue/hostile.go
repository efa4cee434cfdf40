package jsonvalue

// HostileBodies are what no honest client sends — duplicate names, lone
// surrogates, invalid UTF-8, NUL, odd numbers, deep nesting, two values —
// the seeds of every fuzz target that takes a body (internal/fastjson's
// canonical form, ingest's parsers and its API).
var HostileBodies = []string{
	`{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"input_tokens":3}`,
	`{"user_id":"u","user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"user_id":"\ud800","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"user_id":"\udc00\ud800","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"user_id":"\ud83d\ude00","model_id":"m","input_tokens":1,"output_tokens":2}`,
	"{\"user_id\":\"\xff\xfe\",\"model_id\":\"m\",\"input_tokens\":1,\"output_tokens\":2}",
	`{"user_id":"\u0000","model_id":"m","input_tokens":1,"output_tokens":2}`,
	`{"user_id":"u","model_id":"m","input_tokens":-0,"output_tokens":2}`,
	`{"user_id":"u","model_id":"m","input_tokens":1e400,"output_tokens":2}`,
	`{"user_id":"u","model_id":"m","input_tokens":99999999999999999999999,"output_tokens":2}`,
	`{"user_id":"u","model_id":"m","input_tokens":1099511627776,"output_tokens":1.0}`,
	`{"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
	`{"a":{"b":{},"b":1}}`,
	`{"\u0061":1,"a":2}`,
	`[-0, 0, 1E2, 100, 1e-7, 5e-324, 1.7976931348623157e308]`,
	`{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"timestamp":"2026-11-30T10:00:00.123456789+14:00"}`,
	`{"user_id":"u","model_id":"m","input_tokens":1,"output_tokens":2,"tenant_id":"not-a-uuid"}`,
	`{} {}`,
	`null`,
	``,
}
