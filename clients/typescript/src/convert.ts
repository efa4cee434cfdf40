/** Usage events from provider responses. */

import type { UsageEventInput } from "./client.js";

type Obj = Record<string, unknown>;

function obj(v: unknown): Obj | undefined {
  return v !== null && typeof v === "object" ? (v as Obj) : undefined;
}

function int(m: Obj | undefined, key: string): number {
  const v = m?.[key];
  if (v === undefined || v === null) return 0;
  if (typeof v !== "number" || !Number.isInteger(v)) {
    throw new TypeError(`overage: usage.${key} must be an integer, got ${JSON.stringify(v)}`);
  }
  return v;
}

function str(v: unknown): string | undefined {
  return typeof v === "string" ? v : undefined;
}

/**
 * The usage event of an OpenAI chat completion, the final chunk of a streamed
 * one (sent with `stream_options: { include_usage: true }`), or a Responses
 * API response: `requestId` (its `id`), `modelId`, `inputTokens`
 * (`prompt_tokens`), `outputTokens` (`completion_tokens`) and, where present,
 * `cacheReadInputTokens` (`prompt_tokens_details.cached_tokens`) and
 * `reasoningOutputTokens` (`completion_tokens_details.reasoning_tokens`),
 * which OpenAI already counts inside the totals; `timestamp` from its
 * `created` (or `created_at`), so reporting the same response again sends
 * the same body and is answered with the stored outcome, not a key reuse.
 * Add `userId` and pass it to `record`.
 */
export function fromOpenAI(response: unknown): Omit<UsageEventInput, "userId"> {
  const r = obj(response);
  if (!r) throw new TypeError("overage: expected an OpenAI response object");
  const usage = obj(r["usage"]);
  if (!usage) {
    throw new TypeError(
      "overage: the OpenAI response has no usage (a streamed response reports it only in its last chunk, " +
        "and only when requested with stream_options: { include_usage: true })",
    );
  }
  const chat = "prompt_tokens" in usage || "completion_tokens" in usage;
  const ev: Omit<UsageEventInput, "userId"> = {
    requestId: str(r["id"]),
    modelId: str(r["model"]) ?? "",
    inputTokens: int(usage, chat ? "prompt_tokens" : "input_tokens"),
    outputTokens: int(usage, chat ? "completion_tokens" : "output_tokens"),
  };
  const created = r["created"] ?? r["created_at"];
  if (typeof created === "number" && Number.isInteger(created) && created > 0) {
    ev.timestamp = new Date(created * 1000).toISOString().replace(".000Z", "Z");
  }
  const cached = int(obj(usage[chat ? "prompt_tokens_details" : "input_tokens_details"]), "cached_tokens");
  const reasoning = int(obj(usage[chat ? "completion_tokens_details" : "output_tokens_details"]), "reasoning_tokens");
  if (cached) ev.cacheReadInputTokens = cached;
  if (reasoning) ev.reasoningOutputTokens = reasoning;
  return ev;
}

/**
 * The usage event of an Anthropic message: `requestId` (its `id`),
 * `modelId`, `inputTokens` (Anthropic's `input_tokens` +
 * `cache_read_input_tokens` + `cache_creation_input_tokens`, which it reports
 * apart), `outputTokens` and the two cache counts where present.
 *
 * For a streamed message pass the final `message_delta` event with the
 * `message_start` event it followed (`{ messageStart }`): the start carries
 * the id, model and input usage, the delta the cumulative output (and, on
 * newer APIs, input) counts, which win. A `message_start` event or the SDK's
 * final accumulated message (`stream.finalMessage()`) works alone.
 */
export function fromAnthropic(message: unknown, opts: { messageStart?: unknown } = {}): Omit<UsageEventInput, "userId"> {
  let m = obj(message);
  if (!m) throw new TypeError("overage: expected an Anthropic message object");
  if (m["type"] === "message_start") m = obj(m["message"]) ?? {};
  let usage: Obj = { ...(obj(m["usage"]) ?? {}) };
  if (m["type"] === "message_delta") {
    let start = obj(opts.messageStart);
    if (!start) {
      throw new TypeError("overage: a message_delta event needs its message_start ({ messageStart }) for the id, model and input usage");
    }
    if (start["type"] === "message_start") start = obj(start["message"]) ?? {};
    const merged: Obj = { ...(obj(start["usage"]) ?? {}) };
    for (const [k, v] of Object.entries(usage)) if (v !== null && v !== undefined) merged[k] = v;
    usage = merged;
    m = start;
  }
  if (Object.keys(usage).length === 0) throw new TypeError("overage: the Anthropic message has no usage");
  const read = int(usage, "cache_read_input_tokens");
  const write = int(usage, "cache_creation_input_tokens");
  const ev: Omit<UsageEventInput, "userId"> = {
    requestId: str(m["id"]),
    modelId: str(m["model"]) ?? "",
    inputTokens: int(usage, "input_tokens") + read + write,
    outputTokens: int(usage, "output_tokens"),
  };
  if (read) ev.cacheReadInputTokens = read;
  if (write) ev.cacheCreationInputTokens = write;
  return ev;
}
