// fromOpenAI and fromAnthropic against recorded provider responses (clients/testdata/providers).

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { fromAnthropic, fromOpenAI } from "../dist/index.js";
import { loadJSON } from "./scripted_server.mjs";

const p = (name) => loadJSON("providers/" + name);
const expected = p("expected.json");
const camel = (ev) => Object.fromEntries(Object.entries(ev).map(([k, v]) => [k.replace(/_([a-z])/g, (_, c) => c.toUpperCase()), v]));

describe("fromOpenAI", () => {
  for (const name of ["openai_chat_completion.json", "openai_stream_final_chunk.json"]) {
    it(name, () => assert.deepEqual(fromOpenAI(p(name)), camel(expected[name])));
  }
  it("says how to get usage from a stream", () => {
    assert.throws(() => fromOpenAI(p("openai_stream_chunk_without_usage.json")), /include_usage/);
  });
  it("reads the Responses API", () => {
    const r = { id: "resp_1", model: "o3", usage: { input_tokens: 50, input_tokens_details: { cached_tokens: 10 }, output_tokens: 40, output_tokens_details: { reasoning_tokens: 30 } } };
    assert.deepEqual(fromOpenAI(r), { requestId: "resp_1", modelId: "o3", inputTokens: 50, outputTokens: 40, cacheReadInputTokens: 10, reasoningOutputTokens: 30 });
  });
  it("refuses counts that are not integers", () => {
    assert.throws(() => fromOpenAI({ id: "x", model: "m", usage: { prompt_tokens: "12", completion_tokens: 1 } }), TypeError);
  });
});

describe("fromAnthropic", () => {
  for (const name of ["anthropic_message.json", "anthropic_message_start.json"]) {
    it(name, () => assert.deepEqual(fromAnthropic(p(name)), camel(expected[name])));
  }
  it("merges a message_delta with its message_start", () => {
    const got = fromAnthropic(p("anthropic_message_delta.json"), { messageStart: p("anthropic_message_start.json") });
    assert.deepEqual(got, camel(expected["anthropic_message_delta.json after anthropic_message_start.json"]));
    assert.throws(() => fromAnthropic(p("anthropic_message_delta.json")), /message_start/);
  });
});
