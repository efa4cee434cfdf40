// The client against a real `overage serve`. `go test ./clients/clientstest`
// starts the server on a fresh database, creates a tenant and runs this file
// with OVERAGE_URL, OVERAGE_API_KEY and OVERAGE_LOSSY_URL (a proxy that lets
// the server execute the first request of each Idempotency-Key, then closes
// the connection without its answer). Without them the tests are skipped,
// saying so; the Go test fails on a skip.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { describe, it } from "node:test";

import { Client, OverageError, PROBLEM_KEY_REUSED, PROBLEM_STREAM_CLOSED, WebhookVerificationError, verifyWebhook } from "../dist/index.js";

const { OVERAGE_URL: URL_, OVERAGE_API_KEY: KEY, OVERAGE_LOSSY_URL: LOSSY } = process.env;
const skip = URL_ && KEY && LOSSY ? false : "set OVERAGE_URL, OVERAGE_API_KEY and OVERAGE_LOSSY_URL (go test ./clients/clientstest does)";

const opts = { apiKey: KEY ?? "", baseDelayMs: 10, maxDelayMs: 100, deadlineMs: 30_000 };
const c = () => new Client({ ...opts, baseUrl: URL_ });
const lossy = () => new Client({ ...opts, baseUrl: LOSSY });
const rid = () => "ts-" + randomUUID().slice(0, 12);
// A fixed timestamp, so that sending an event again sends the same body: a
// default timestamp is "now", fixed per call, not per event.
const at = new Date(Math.floor(Date.now() / 1000) * 1000);
const event = (requestId, more = {}) => ({ requestId, timestamp: at, userId: "u_42", modelId: "gpt-4o", inputTokens: 1200, outputTokens: 350, ...more });

async function logsOf(requestId) {
  const res = await fetch(`${URL_}/v1/usage-events?request_id=${requestId}`, { headers: { Authorization: `Bearer ${KEY}` } });
  assert.equal(res.status, 200);
  return (await res.json()).usage_events;
}

describe("live", { skip }, () => {
  it("records, replays, answers a duplicate and refuses key reuse", async () => {
    const id = rid();
    const r = await c().record(event(id));
    assert.deepEqual([r.replayed, r.duplicate, r.key, r.attempts, r.log.billing_status], [false, false, id, 1, "pending"]);
    assert.deepEqual(r.log.overage, { input_tokens: 1200, output_tokens: 350 });
    const again = await c().record(event(id));
    assert.deepEqual([again.replayed, again.log.id], [true, r.log.id]);
    const dup = await c().record(event(id), { idempotencyKey: id + "-other" });
    assert.deepEqual([dup.duplicate, dup.replayed, dup.log.id], [true, false, r.log.id]);
    await assert.rejects(c().record(event(id, { inputTokens: 1 }), { idempotencyKey: id }),
      (e) => e instanceof OverageError && e.status === 409 && e.type === PROBLEM_KEY_REUSED && e.attempts === 1);
    assert.equal((await logsOf(id)).length, 1);
  });

  it("usage counts what was recorded", async () => {
    const byMeter = (u) => Object.fromEntries(u.meters.map((m) => [m.meter, m]));
    const before = byMeter(await c().usage());
    await c().record(event(rid(), { inputTokens: 1234, outputTokens: 56 }));
    const u = await c().usage();
    const after = byMeter(u);
    assert.deepEqual([after.input.used - before.input.used, after.output.used - before.output.used], [1234, 56]);
    assert.equal(after.input.eventName, "llm_input_tokens");
    assert.ok(u.periodStart < u.periodEnd);
  });

  it("verifies the server's signature", () => {
    const body = process.env.OVERAGE_WEBHOOK_BODY ?? "";
    const header = process.env.OVERAGE_WEBHOOK_SIGNATURE, secret = process.env.OVERAGE_WEBHOOK_SECRET ?? "";
    assert.equal(verifyWebhook(body, header, secret).data.used, 80500);
    assert.throws(() => verifyWebhook(body.replace("80500", "80501"), header, secret), WebhookVerificationError);
  });

  it("an invalid event names its field and is not retried", async () => {
    await assert.rejects(c().record(event(rid(), { inputTokens: 0, outputTokens: 0 })),
      (e) => e instanceof OverageError && [400, 422].includes(e.status) && e.attempts === 1 && e.fields.length > 0);
  });

  it("a lost answer is replayed and recorded once", async () => {
    const id = rid();
    const r = await lossy().record(event(id));
    assert.deepEqual([r.replayed, r.attempts], [true, 2]);
    assert.deepEqual((await logsOf(id)).map((l) => l.id), [r.log.id]);
    const n = await lossy().record({ userId: "u_42", modelId: "gpt-4o", inputTokens: 7, outputTokens: 1 });
    assert.deepEqual([n.replayed, n.attempts, n.key.length], [true, 2, 36]);
  });

  it("a batch: lost answer replayed, regrouped events duplicates", async () => {
    const id = rid();
    const evs = ["a", "b", "c"].map((s, i) => event(`${id}-${s}`, { inputTokens: 100 + i }));
    const b = await lossy().recordBatch(evs);
    assert.deepEqual([b.replayed, b.attempts, b.created, b.duplicates], [true, 2, 3, 0]);
    assert.deepEqual(b.events.map((e) => e.index), [0, 1, 2]);
    const again = await c().recordBatch([event(`${id}-d`), ...evs.slice(1)]);
    assert.deepEqual([again.created, again.duplicates], [1, 2]);
    assert.deepEqual(again.events.map((e) => e.duplicate), [false, true, true]);
    assert.equal(again.events[1].id, b.events[1].id);
  });

  it("a stream: checkpoints, final, closed", async () => {
    const id = rid();
    const s = c().stream(id, "u_42", "gpt-4o");
    const a = await s.checkpoint(100, 10);
    assert.deepEqual([a.key, a.stale, a.log.input_tokens, a.stream.input_tokens], [id + ":0", false, 100, 100]);
    const b = await s.checkpoint(250, 40);
    assert.deepEqual([b.log.input_tokens, b.log.output_tokens, b.stream.output_tokens], [150, 30, 40]);
    const f = await s.final(240, 45);
    assert.deepEqual([f.stream.final, f.stream.input_tokens, f.stream.output_tokens], [true, 240, 45]);
    await assert.rejects(s.checkpoint(300, 50), (e) => e.status === 409 && e.type === PROBLEM_STREAM_CLOSED);
    const logs = await logsOf(id);
    assert.equal(logs.reduce((n, l) => n + l.input_tokens, 0), 240);
    assert.equal(logs.reduce((n, l) => n + l.output_tokens, 0), 45);
  });

  it("a correction, replayed under its key", async () => {
    const r = await c().record(event(rid()));
    const fix = await c().correct(r.log.id, { inputTokens: 1000, outputTokens: 350, reason: "provider re-counted" });
    assert.deepEqual([fix.log.corrects, fix.log.input_tokens, fix.log.output_tokens], [r.log.id, -200, 0]);
    assert.equal(fix.stripeTimestamp, "original"); // the period is open
    const again = await c().correct(r.log.id, { inputTokens: 1000, outputTokens: 350, reason: "provider re-counted" }, { idempotencyKey: fix.key });
    assert.deepEqual([again.replayed, again.log.id], [true, fix.log.id]);
  });
});
