// The client's surface against a scripted server: what it sends and how it reads the answers.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Client, OverageError } from "../dist/index.js";
import { scriptedServer } from "./scripted_server.mjs";

async function serve(t, ...script) {
  const srv = await scriptedServer(script);
  t.after(() => srv.close());
  return srv;
}
const client = (srv, more = {}) => new Client({ baseUrl: srv.url + "/", apiKey: "ovg_k", baseDelayMs: 1, maxDelayMs: 2, maxAttempts: 3, ...more });

describe("Client", () => {
  it("record sends the event in the API's names, timestamp fixed", async (t) => {
    const srv = await serve(t, { status: 202, body: { id: "l1", duplicate: false } });
    const r = await client(srv).record({ requestId: "r1", userId: "u", modelId: "m", inputTokens: 5, outputTokens: 1, cacheReadInputTokens: 0,
      timestamp: new Date("2026-11-29T10:00:00Z") });
    assert.deepEqual([r.log.id, r.replayed, r.duplicate, r.key, r.attempts], ["l1", false, false, "r1", 1]);
    assert.deepEqual(JSON.parse(srv.seen[0].body), { request_id: "r1", user_id: "u", model_id: "m", input_tokens: 5, output_tokens: 1, timestamp: "2026-11-29T10:00:00.000Z" });
    assert.equal(srv.seen[0].path, "/v1/usage-events");
  });

  it("checks its input before sending", async (t) => {
    const srv = await serve(t);
    const c = client(srv);
    await assert.rejects(c.record({ requestId: "r", userId: "u", modelId: "m", inputTokens: 1, outputTokens: 1, inputToken: 3 }), TypeError);
    await assert.rejects(c.recordBatch([{ userId: "u", modelId: "m", inputTokens: 1, outputTokens: 1 }]), /requestId/);
    await assert.rejects(c.recordBatch([]), RangeError);
    assert.throws(() => c.stream("", "u", "m"), TypeError);
    assert.equal(srv.seen.length, 0);
  });

  it("numbers stream checkpoints", async (t) => {
    const tot = { sequence: 0, final: false, input_tokens: 10, output_tokens: 2, closed: false };
    const srv = await serve(t, { status: 202, body: { id: "l1", stale: false, stream: tot } }, { status: 200, body: { stale: true, stream: tot } },
      { status: 202, body: { id: "l2", stale: false, stream: { ...tot, final: true, closed: true }, correction: { id: "l3" } } });
    const s = client(srv).stream("chatcmpl-9", "u", "m");
    const a = await s.checkpoint(10, 2);
    const b = await s.checkpoint(10, 2);
    const c = await s.final(12, 1, { reasoningOutputTokens: 1 });
    assert.deepEqual([a.key, b.key, c.key], ["chatcmpl-9:0", "chatcmpl-9:1", "chatcmpl-9:2"]);
    assert.deepEqual([a.log.id, a.stale, b.log, b.stale, c.correction.id, c.stream.closed], ["l1", false, null, true, "l3", true]);
    const bodies = srv.seen.map((x) => JSON.parse(x.body));
    assert.deepEqual(bodies.map((x) => x.stream), [{ sequence: 0, final: false }, { sequence: 1, final: false }, { sequence: 2, final: true }]);
    assert.equal(bodies[2].reasoning_output_tokens, 1);
  });

  it("correct", async (t) => {
    const srv = await serve(t, { status: 202, body: { id: "c1", kind: "correction", stripe_timestamp: "original" } });
    const r = await client(srv).correct("log/1", { inputTokens: 10, outputTokens: 0, reason: "recount" }, { idempotencyKey: "fix-1" });
    assert.deepEqual([r.log.id, r.stripeTimestamp, r.key], ["c1", "original", "fix-1"]);
    assert.equal(srv.seen[0].path, "/v1/usage-events/log%2F1/corrections");
    assert.deepEqual(JSON.parse(srv.seen[0].body), { input_tokens: 10, output_tokens: 0, reason: "recount" });
  });

  it("usage is read, and retried", async (t) => {
    const usage = { tenant_id: "t1", period: { start: "2026-11-01T00:00:00Z", end: "2026-12-01T00:00:00Z" },
      meters: [{ meter: "input", event_name: "llm_input_tokens", included: 100000, used: 80500, remaining: 19500, overage: 0, billed: 0, pending: 0 }] };
    const srv = await serve(t, { status: 503, body: { type: "x" } }, { status: 200, body: usage });
    const u = await client(srv).usage({ periodStart: "2026-11-01T00:00:00Z" });
    assert.deepEqual(u, { tenantId: "t1", periodStart: "2026-11-01T00:00:00Z", periodEnd: "2026-12-01T00:00:00Z",
      meters: [{ meter: "input", eventName: "llm_input_tokens", included: 100000, used: 80500, remaining: 19500, overage: 0, billed: 0, pending: 0 }] });
    assert.deepEqual(srv.seen.map((s) => [s.method, s.path, s.key]), Array(2).fill(["GET", "/v1/usage?period_start=2026-11-01T00%3A00%3A00Z", undefined]));
  });

  it("an AbortSignal ends the operation, waits included", async (t) => {
    const srv = await serve(t, { status: 503, headers: { "Retry-After": "30" }, body: {} });
    const ctl = new AbortController();
    const p = client(srv).record({ requestId: "r", userId: "u", modelId: "m", inputTokens: 1, outputTokens: 1 }, { signal: ctl.signal });
    // Abort once the first attempt was answered and the client waits on the Retry-After.
    while (srv.seen.length === 0) await new Promise((r) => setImmediate(r));
    ctl.abort(new Error("caller gave up"));
    await assert.rejects(p, /caller gave up/);
    assert.equal(srv.seen.length, 1);
    await assert.rejects(client(srv).usage({ signal: AbortSignal.abort() }), { name: "AbortError" });
    assert.equal(srv.seen.length, 1);
  });

  it("an AbortSignal ends an attempt in flight", async (t) => {
    const srv = await serve(t, { hang: true });
    const ctl = new AbortController();
    const p = client(srv, { timeoutMs: 60_000 }).record({ requestId: "r", userId: "u", modelId: "m", inputTokens: 1, outputTokens: 1 }, { signal: ctl.signal });
    while (srv.seen.length === 0) await new Promise((r) => setImmediate(r));
    ctl.abort(new Error("stop"));
    await assert.rejects(p, /stop/);
  });

  it("a refusal carries its problem", async (t) => {
    const srv = await serve(t, { status: 401, content_type: "application/problem+json", body: { type: "https://overage.dev/problems/unauthorized", title: "Unauthorized", status: 401 } });
    await assert.rejects(client(srv).usage(), (e) => e instanceof OverageError && e.status === 401 && e.type.endsWith("/unauthorized") && e.attempts === 1);
  });
});
