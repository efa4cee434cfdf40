// The shared retry cases, run against a scripted server.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Client, DeadlineExceededError, OverageError, TransportError } from "../dist/index.js";
import { loadJSON, scriptedServer } from "./scripted_server.mjs";

const table = loadJSON("retry_cases.json");
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

function camel(ev) {
  const out = {};
  for (const [k, v] of Object.entries(ev)) out[k.replace(/_([a-z])/g, (_, c) => c.toUpperCase())] = v;
  return out;
}

// runCase runs one case and returns what went wrong (nothing when it passed).
export async function runCase(c, makeClient = (opts) => new Client(opts)) {
  const cfg = table.client;
  const input = table.inputs[c.operation];
  const srv = await scriptedServer(c.script, table.success_bodies[c.operation]);
  const problems = [];
  try {
    const client = makeClient({
      baseUrl: srv.url,
      apiKey: "ovg_test_key",
      maxAttempts: cfg.max_attempts,
      baseDelayMs: cfg.base_delay_ms,
      maxDelayMs: cfg.max_delay_ms,
      timeoutMs: cfg.timeout_ms,
      deadlineMs: c.deadline_ms ?? 60_000,
    });
    const opts = c.idempotency_key ? { idempotencyKey: c.idempotency_key } : {};
    let result, err;
    const start = performance.now();
    try {
      switch (c.operation) {
        case "record":
        case "record_no_request_id":
          result = await client.record(camel(input), opts);
          break;
        case "record_batch":
          result = await client.recordBatch(input.map(camel), opts);
          break;
        case "checkpoint":
          result = await client.stream(input.request_id, input.user_id, input.model_id).checkpoint(input.input_tokens, input.output_tokens);
          break;
        case "correct":
          result = await client.correct(input.usage_log_id, { inputTokens: input.input_tokens, outputTokens: input.output_tokens, reason: input.reason }, opts);
          break;
        default:
          throw new Error(`unknown operation ${c.operation}`);
      }
    } catch (e) {
      if (!(e instanceof OverageError)) throw e;
      err = e;
    }
    const elapsed = performance.now() - start;
    const exp = c.expect;
    const seen = srv.seen;
    if (seen.length !== exp.attempts) problems.push(`${seen.length} attempts reached the server, want ${exp.attempts}`);
    seen.forEach((s, i) => {
      if (s.key !== seen[0].key) problems.push(`attempt ${i + 1} carried Idempotency-Key ${s.key}, the first ${seen[0].key}`);
      if (s.body !== seen[0].body) problems.push(`attempt ${i + 1} carried another body than the first`);
      if (s.auth !== "Bearer ovg_test_key") problems.push(`attempt ${i + 1} carried Authorization ${s.auth}`);
    });
    if (seen.length > 0) {
      if (exp.key === "uuid" ? !UUID.test(seen[0].key ?? "") : seen[0].key !== exp.key) problems.push(`key ${seen[0].key}, want ${exp.key}`);
    }
    if (exp.min_elapsed_ms && elapsed < exp.min_elapsed_ms) problems.push(`took ${Math.round(elapsed)}ms, want at least ${exp.min_elapsed_ms}ms (Retry-After not honoured)`);
    if (exp.outcome === "ok") {
      if (err) problems.push(`failed: ${err.message}`);
      else {
        if (result.attempts !== exp.attempts) problems.push(`result.attempts ${result.attempts}, want ${exp.attempts}`);
        if (result.replayed !== exp.replayed) problems.push(`result.replayed ${result.replayed}, want ${exp.replayed}`);
        if (seen.length > 0 && result.key !== seen[0].key) problems.push(`result.key ${result.key}, sent ${seen[0].key}`);
      }
    } else if (exp.outcome === "deadline") {
      if (!(err instanceof DeadlineExceededError)) problems.push(`outcome ${err?.message ?? "success"}, want DeadlineExceededError`);
    } else {
      if (!err || err instanceof DeadlineExceededError) problems.push(`outcome ${err?.message ?? "success"}, want an error`);
      else {
        if (err.status !== exp.status) problems.push(`error status ${err.status}, want ${exp.status} (${err.message})`);
        if (exp.status === 0 && !(err instanceof TransportError)) problems.push(`error ${err.name}, want a TransportError`);
        if (err.type !== (exp.type ?? "")) problems.push(`error type ${err.type}, want ${exp.type}`);
        const fields = err.fields.map((f) => f.field);
        if (JSON.stringify(fields) !== JSON.stringify(exp.fields ?? [])) problems.push(`error fields ${fields}, want ${exp.fields}`);
        if (err.attempts !== exp.attempts) problems.push(`error.attempts ${err.attempts}, want ${exp.attempts}`);
      }
    }
  } finally {
    await srv.close();
  }
  return problems;
}

describe("shared retry cases", () => {
  assert.ok(table.cases.length > 10);
  for (const c of table.cases) {
    it(c.name, async () => {
      assert.deepEqual(await runCase(c), []);
    });
  }
});

// The double-billing bug: a fresh Idempotency-Key minted for every attempt.
function keyPerAttempt(opts) {
  let n = 0;
  return new Client({
    ...opts,
    fetch: (url, init) => fetch(url, { ...init, headers: { ...init.headers, "Idempotency-Key": `attempt-${++n}` } }),
  });
}

describe("the table catches a broken client", () => {
  it("fails a client that mints its key inside the retry loop", async () => {
    const failed = [];
    for (const c of table.cases) {
      if (c.expect.min_elapsed_ms) continue; // slow, and caught by the others
      if ((await runCase(c, keyPerAttempt)).length > 0) failed.push(c.name);
    }
    for (const want of ["lost answer is resent under the same key and replayed", "a timed-out attempt is resent under the same key", "batch: lost answer replayed under the batch's minted key"]) {
      assert.ok(failed.includes(want), `${want} passed with a key minted per attempt`);
    }
  });
});
