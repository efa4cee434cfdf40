/** The overage client: usage events sent exactly once over HTTP. */

import { randomUUID } from "node:crypto";

import { DeadlineExceededError, type FieldError, OverageError, TransportError } from "./errors.js";

/** The most events one `recordBatch` call may send. */
export const MAX_BATCH_EVENTS = 1000;

export interface ClientOptions {
  /** The overage API, e.g. `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** The tenant's API key. */
  apiKey: string;
  /** Requests per operation at most; default 8. */
  maxAttempts?: number;
  /** Before retry n the client waits a random time in [0, min(maxDelayMs, baseDelayMs * 2^n)), or the server's Retry-After. Defaults 100 and 10,000. */
  baseDelayMs?: number;
  maxDelayMs?: number;
  /** Each attempt's timeout; default 10,000 ms. */
  timeoutMs?: number;
  /** The whole operation's, retries included; default 120,000 ms. */
  deadlineMs?: number;
  /** The fetch to use; default the global one. */
  fetch?: typeof fetch;
  userAgent?: string;
}

/** One LLM call's usage. */
export interface UsageEventInput {
  /** The provider's response id: the event's business key, unique per tenant. Optional for `record`, required in a batch. */
  requestId?: string | undefined;
  /** Default now, fixed before the first attempt so a retry reports the same instant. */
  timestamp?: Date | string;
  userId: string;
  modelId: string;
  inputTokens: number;
  outputTokens: number;
  /** Part of inputTokens. */
  cacheReadInputTokens?: number;
  /** Part of inputTokens. */
  cacheCreationInputTokens?: number;
  /** Part of outputTokens. */
  reasoningOutputTokens?: number;
  tenantId?: string;
}

/** The optional counts of a checkpoint, cumulative like its totals. */
export interface TokenCounts {
  cacheReadInputTokens?: number;
  cacheCreationInputTokens?: number;
  reasoningOutputTokens?: number;
}

export interface OperationOptions {
  /** Names the operation; default the event's requestId, else a random UUID minted once, before the first attempt. */
  idempotencyKey?: string;
  /** Aborts the operation, waits included; the client then throws the signal's reason. */
  signal?: AbortSignal;
}

/** A usage log as the server answers it (the API's JSON, snake_case). */
export interface UsageLog {
  id: string;
  tenant_id: string;
  request_id: string | null;
  timestamp: string;
  user_id: string;
  model_id: string;
  input_tokens: number;
  output_tokens: number;
  overage: { input_tokens: number; output_tokens: number };
  billing_status: string;
  billed_at: string | null;
  created_at: string;
  kind?: string;
  corrects?: string;
  duplicate?: boolean;
  [field: string]: unknown;
}

export interface RecordResult {
  log: UsageLog;
  /** The server answered with the stored outcome of an earlier attempt under the same key. */
  replayed: boolean;
  /** The requestId was already recorded under another key; nothing new was recorded or billed. */
  duplicate: boolean;
  key: string;
  attempts: number;
}

export interface BatchEvent extends UsageLog {
  index: number;
  duplicate: boolean;
}

export interface BatchResult {
  /** One answer per event, in the order sent. */
  events: BatchEvent[];
  created: number;
  duplicates: number;
  replayed: boolean;
  key: string;
  attempts: number;
}

export interface StreamTotals {
  sequence: number;
  final: boolean;
  input_tokens: number;
  output_tokens: number;
  closed: boolean;
}

export interface CheckpointResult {
  /** The usage log of the increase (or, for a final checkpoint that only lowered a total, the correction); null when nothing was recorded. */
  log: UsageLog | null;
  /** The correction a final checkpoint recorded besides an increase. */
  correction: UsageLog | null;
  /** The server already held a checkpoint at or after this one. */
  stale: boolean;
  stream: StreamTotals | null;
  sequence: number;
  key: string;
  replayed: boolean;
  attempts: number;
}

export interface CorrectionInput {
  /** The corrected totals of the usage event: 0 and 0 void it. */
  inputTokens: number;
  outputTokens: number;
  reason: string;
}

export interface CorrectionResult {
  log: UsageLog;
  /** "original" (the original's time) or "correction": which time the Stripe meter event carries. */
  stripeTimestamp: string;
  replayed: boolean;
  key: string;
  attempts: number;
}

export interface MeterUsage {
  meter: string;
  eventName: string;
  included: number;
  used: number;
  remaining: number;
  overage: number;
  billed: number;
  pending: number;
}

export interface Usage {
  tenantId: string;
  periodStart: string;
  periodEnd: string;
  meters: MeterUsage[];
}

export interface UsageOptions {
  periodStart?: string;
  /** For an admin token. */
  tenantId?: string;
  signal?: AbortSignal;
}

const FIELDS: Record<string, string> = {
  requestId: "request_id",
  timestamp: "timestamp",
  userId: "user_id",
  modelId: "model_id",
  inputTokens: "input_tokens",
  outputTokens: "output_tokens",
  cacheReadInputTokens: "cache_read_input_tokens",
  cacheCreationInputTokens: "cache_creation_input_tokens",
  reasoningOutputTokens: "reasoning_output_tokens",
  tenantId: "tenant_id",
};
const OPTIONAL_COUNTS = new Set(["cacheReadInputTokens", "cacheCreationInputTokens", "reasoningOutputTokens"]);

function wireEvent(ev: Record<string, unknown>, now: string): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(ev)) {
    const wire = FIELDS[k];
    if (wire === undefined) throw new TypeError(`overage: unknown event field ${JSON.stringify(k)}`);
    if (v === undefined || v === null) continue;
    if (OPTIONAL_COUNTS.has(k) && v === 0) continue; // absent and 0 mean the same; older servers know no such field
    out[wire] = v instanceof Date ? v.toISOString() : v;
  }
  if (out["timestamp"] === undefined) out["timestamp"] = now;
  return out;
}

function parseRetryAfter(v: string | null): number | undefined {
  if (!v) return undefined;
  const s = v.trim();
  if (/^\d+$/.test(s)) return Number(s) * 1000;
  const when = Date.parse(s);
  return Number.isNaN(when) ? undefined : Math.max(0, when - Date.now());
}

function problem(status: number, statusText: string, text: string, retryAfterMs: number | undefined): OverageError {
  let type = "";
  let title = statusText || `HTTP ${status}`;
  let detail = "";
  const fields: FieldError[] = [];
  try {
    const p: unknown = JSON.parse(text);
    if (p && typeof p === "object") {
      const o = p as Record<string, unknown>;
      if (typeof o["type"] === "string") type = o["type"];
      if (typeof o["title"] === "string" && o["title"]) title = o["title"];
      if (typeof o["detail"] === "string") detail = o["detail"];
      if (Array.isArray(o["errors"])) {
        for (const f of o["errors"]) {
          if (f && typeof f === "object") fields.push({ field: String((f as FieldError).field ?? ""), detail: String((f as FieldError).detail ?? "") });
        }
      }
    }
  } catch {
    // not a problem document: status and title say enough
  }
  const msg = `overage: ${status} ${title}${detail ? ": " + detail : ""}${type ? ` (${type})` : ""}`;
  return new OverageError(msg, { status, type, title, detail, fields, retryAfterMs });
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("The operation was aborted", "AbortError");
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortReason(signal));
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(abortReason(signal!));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

interface Answer {
  body: Record<string, unknown>;
  replayed: boolean;
  attempts: number;
}

/**
 * Reports usage events to an overage server.
 *
 * One logical operation gets one Idempotency-Key, fixed with its body before
 * the first attempt and resent unchanged on every retry: the caller's
 * `idempotencyKey`, else the event's `requestId`, else a random UUID.
 * Transport errors, 5xx, 429 and 409 in progress are retried with exponential
 * backoff and full jitter, or after the server's Retry-After; any other answer
 * is final. At most `maxAttempts` requests, each within `timeoutMs`, all
 * within `deadlineMs`; an `AbortSignal` ends it sooner.
 */
export class Client {
  readonly baseUrl: string;
  readonly maxAttempts: number;
  readonly baseDelayMs: number;
  readonly maxDelayMs: number;
  readonly timeoutMs: number;
  readonly deadlineMs: number;
  readonly #apiKey: string;
  readonly #fetch: typeof fetch;
  readonly #userAgent: string;

  constructor(opts: ClientOptions) {
    if (!opts?.baseUrl) throw new TypeError("overage: baseUrl is required (e.g. http://127.0.0.1:8080)");
    if (!opts.apiKey) throw new TypeError("overage: apiKey is required (the tenant's API key)");
    this.baseUrl = opts.baseUrl.replace(/\/+$/, "");
    this.#apiKey = opts.apiKey;
    this.maxAttempts = opts.maxAttempts ?? 8;
    if (this.maxAttempts < 1) throw new RangeError("overage: maxAttempts must be at least 1");
    this.baseDelayMs = opts.baseDelayMs ?? 100;
    this.maxDelayMs = opts.maxDelayMs ?? 10_000;
    this.timeoutMs = opts.timeoutMs ?? 10_000;
    this.deadlineMs = opts.deadlineMs ?? 120_000;
    const f = opts.fetch ?? globalThis.fetch;
    if (typeof f !== "function") throw new TypeError("overage: no fetch: Node 18 or newer has a global fetch, or pass options.fetch");
    this.#fetch = f;
    this.#userAgent = opts.userAgent ?? "overage-typescript/0.1.0";
  }

  /** Records one LLM call's usage. */
  async record(event: UsageEventInput, opts: OperationOptions = {}): Promise<RecordResult> {
    const body = wireEvent({ ...event }, new Date().toISOString());
    const key = opts.idempotencyKey || (body["request_id"] as string | undefined) || randomUUID();
    const a = await this.send("POST", "/v1/usage-events", key, JSON.stringify(body), opts.signal);
    const log = a.body as UsageLog;
    return { log, replayed: a.replayed, duplicate: log.duplicate === true, key, attempts: a.attempts };
  }

  /**
   * Records 1 to 1,000 events in one request and one transaction. Every
   * event needs a requestId, unique in the batch: that is what makes sending
   * them again, regrouped under a new key, safe.
   */
  async recordBatch(events: UsageEventInput[], opts: OperationOptions = {}): Promise<BatchResult> {
    if (!Array.isArray(events) || events.length < 1 || events.length > MAX_BATCH_EVENTS) {
      throw new RangeError(`overage: a batch holds 1 to ${MAX_BATCH_EVENTS} events, got ${events?.length}`);
    }
    const now = new Date().toISOString();
    const wire = events.map((ev, i) => {
      if (!ev.requestId) throw new TypeError(`overage: batch event ${i} has no requestId; every batched event needs one`);
      return wireEvent({ ...ev }, now);
    });
    const key = opts.idempotencyKey || randomUUID();
    const a = await this.send("POST", "/v1/usage-events/batch", key, JSON.stringify({ events: wire }), opts.signal);
    return {
      events: (a.body["events"] as BatchEvent[]) ?? [],
      created: Number(a.body["created"] ?? 0),
      duplicates: Number(a.body["duplicates"] ?? 0),
      replayed: a.replayed,
      key,
      attempts: a.attempts,
    };
  }

  /** Starts reporting a streamed response identified by requestId (the provider's response id) as cumulative checkpoints. */
  stream(requestId: string, userId: string, modelId: string): Stream {
    if (!requestId) throw new TypeError("overage: a stream needs a requestId");
    return new Stream(this, requestId, userId, modelId);
  }

  /** Corrects usage log `usageLogId` to these totals; the server records the difference as a new log of kind correction. */
  async correct(usageLogId: string, correction: CorrectionInput, opts: OperationOptions = {}): Promise<CorrectionResult> {
    if (!usageLogId) throw new TypeError("overage: correct needs the usage log id");
    const key = opts.idempotencyKey || randomUUID();
    const body = JSON.stringify({ input_tokens: correction.inputTokens, output_tokens: correction.outputTokens, reason: correction.reason });
    const a = await this.send("POST", `/v1/usage-events/${encodeURIComponent(usageLogId)}/corrections`, key, body, opts.signal);
    return { log: a.body as UsageLog, stripeTimestamp: String(a.body["stripe_timestamp"] ?? ""), replayed: a.replayed, key, attempts: a.attempts };
  }

  /** The tenant's usage so far in the current period (or the one starting at periodStart), per meter. */
  async usage(opts: UsageOptions = {}): Promise<Usage> {
    const q = new URLSearchParams();
    if (opts.tenantId) q.set("tenant_id", opts.tenantId);
    if (opts.periodStart) q.set("period_start", opts.periodStart);
    const qs = q.toString();
    const a = await this.send("GET", "/v1/usage" + (qs ? "?" + qs : ""), undefined, undefined, opts.signal);
    const period = (a.body["period"] ?? {}) as Record<string, unknown>;
    const meters = ((a.body["meters"] ?? []) as Record<string, unknown>[]).map((m) => ({
      meter: String(m["meter"] ?? ""),
      eventName: String(m["event_name"] ?? ""),
      included: Number(m["included"] ?? 0),
      used: Number(m["used"] ?? 0),
      remaining: Number(m["remaining"] ?? 0),
      overage: Number(m["overage"] ?? 0),
      billed: Number(m["billed"] ?? 0),
      pending: Number(m["pending"] ?? 0),
    }));
    return { tenantId: String(a.body["tenant_id"] ?? ""), periodStart: String(period["start"] ?? ""), periodEnd: String(period["end"] ?? ""), meters };
  }

  /**
   * Sends the same request (key and body fixed by the caller) until it is
   * answered 2xx, refused, the attempts run out, the deadline passes or
   * signal aborts.
   * @internal
   */
  async send(method: string, path: string, key: string | undefined, body: string | undefined, signal: AbortSignal | undefined): Promise<Answer> {
    const end = Date.now() + this.deadlineMs;
    for (let attempt = 1; ; attempt++) {
      try {
        const timeout = Math.max(1, Math.min(this.timeoutMs, end - Date.now()));
        const a = await this.attempt(method, path, key, body, signal, timeout);
        return { ...a, attempts: attempt };
      } catch (e) {
        if (!(e instanceof OverageError)) throw e;
        e.attempts = attempt;
        e.key = key;
        if (!e.retryable || attempt >= this.maxAttempts) throw e;
        const wait = e.retryAfterMs ?? this.backoff(attempt);
        if (Date.now() + wait >= end) {
          throw new DeadlineExceededError(`overage: the deadline of ${this.deadlineMs}ms would pass before the next attempt; last: ${e.message}`, {
            status: e.status,
            type: e.type,
            title: e.title,
            detail: e.detail,
            fields: e.fields,
            attempts: attempt,
            key,
            cause: e,
          });
        }
        await sleep(wait, signal);
      }
    }
  }

  private backoff(attempt: number): number {
    return Math.random() * Math.min(this.maxDelayMs, this.baseDelayMs * 2 ** Math.min(attempt - 1, 30));
  }

  private async attempt(
    method: string,
    path: string,
    key: string | undefined,
    body: string | undefined,
    signal: AbortSignal | undefined,
    timeoutMs: number,
  ): Promise<{ body: Record<string, unknown>; replayed: boolean }> {
    if (signal?.aborted) throw abortReason(signal);
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(new TransportError(`overage: no answer within ${timeoutMs}ms`)), timeoutMs);
    const onAbort = (): void => ctl.abort(abortReason(signal!));
    signal?.addEventListener("abort", onAbort, { once: true });
    const headers: Record<string, string> = {
      Authorization: "Bearer " + this.#apiKey,
      Accept: "application/json",
      "User-Agent": this.#userAgent,
    };
    if (key !== undefined) headers["Idempotency-Key"] = key;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let res: Response;
    let text: string;
    try {
      res = await this.#fetch(this.baseUrl + path, { method, headers, body: body ?? null, signal: ctl.signal, redirect: "error" });
      text = await res.text();
    } catch (e) {
      if (signal?.aborted) throw abortReason(signal);
      const cause = (e as { cause?: unknown })?.cause;
      const why = ctl.signal.aborted ? `no answer within ${timeoutMs}ms` : String((cause as Error)?.message ?? (e as Error)?.message ?? e);
      throw new TransportError(`overage: no answer from ${this.baseUrl}: ${why}`, { cause: e });
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
    if (res.status < 200 || res.status > 299) {
      throw problem(res.status, res.statusText, text, parseRetryAfter(res.headers.get("Retry-After")));
    }
    let parsed: unknown = {};
    if (text) {
      try {
        parsed = JSON.parse(text);
      } catch (e) {
        throw new OverageError(`overage: ${res.status} answer is not JSON: ${(e as Error).message}`, { status: res.status });
      }
    }
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
      throw new OverageError(`overage: ${res.status} answer is not a JSON object`, { status: res.status });
    }
    return { body: parsed as Record<string, unknown>, replayed: (res.headers.get("Idempotent-Replayed") ?? "").toLowerCase() === "true" };
  }
}

/**
 * Reports one streamed LLM response as cumulative checkpoints: `checkpoint`
 * with the totals so far as the answer streams (each records only the
 * increase, so a checkpoint lost for good loses nothing), then `final` with
 * the provider's authoritative usage, which may be lower (the server records
 * the difference as a correction). Checkpoint n is sent under the key
 * `<requestId>:<n>`, numbered from 0 in call order, with `record`'s retries.
 */
export class Stream {
  readonly requestId: string;
  readonly userId: string;
  readonly modelId: string;
  readonly #client: Client;
  #next = 0;

  constructor(client: Client, requestId: string, userId: string, modelId: string) {
    this.#client = client;
    this.requestId = requestId;
    this.userId = userId;
    this.modelId = modelId;
  }

  /** Reports the totals so far. */
  checkpoint(inputTokens: number, outputTokens: number, counts: TokenCounts = {}, opts: { signal?: AbortSignal } = {}): Promise<CheckpointResult> {
    return this.#send(inputTokens, outputTokens, false, counts, opts.signal);
  }

  /** Reports the response's final usage; nothing is recorded after it. */
  final(inputTokens: number, outputTokens: number, counts: TokenCounts = {}, opts: { signal?: AbortSignal } = {}): Promise<CheckpointResult> {
    return this.#send(inputTokens, outputTokens, true, counts, opts.signal);
  }

  async #send(inputTokens: number, outputTokens: number, final: boolean, counts: TokenCounts, signal: AbortSignal | undefined): Promise<CheckpointResult> {
    const sequence = this.#next++;
    const body = wireEvent(
      { ...counts, requestId: this.requestId, userId: this.userId, modelId: this.modelId, inputTokens, outputTokens },
      new Date().toISOString(),
    );
    body["stream"] = { sequence, final };
    const key = `${this.requestId}:${sequence}`;
    const a = await this.#client.send("POST", "/v1/usage-events", key, JSON.stringify(body), signal);
    const stream = (a.body["stream"] as StreamTotals | undefined) ?? null;
    if (stream === null) {
      // A plain event recorded this request id first: the server answered with its log as a duplicate.
      return { log: a.body as UsageLog, correction: null, stale: false, stream: null, sequence, key, replayed: a.replayed, attempts: a.attempts };
    }
    return {
      log: a.body["id"] ? (a.body as UsageLog) : null,
      correction: (a.body["correction"] as UsageLog | undefined) ?? null,
      stale: a.body["stale"] === true,
      stream,
      sequence,
      key,
      replayed: a.replayed,
      attempts: a.attempts,
    };
  }
}
