/** The errors of the overage client. */

export const PROBLEM_BASE = "https://overage.dev/problems/";
export const PROBLEM_KEY_REUSED = PROBLEM_BASE + "idempotency-key-reused";
export const PROBLEM_IN_PROGRESS = PROBLEM_BASE + "idempotency-key-in-progress";
export const PROBLEM_STREAM_CLOSED = PROBLEM_BASE + "stream-closed";

/** One bad input the server named, e.g. `events[1].input_tokens`. */
export interface FieldError {
  field: string;
  detail: string;
}

export interface OverageErrorInit {
  status?: number;
  type?: string;
  title?: string;
  detail?: string;
  fields?: FieldError[];
  attempts?: number;
  key?: string | undefined;
  retryAfterMs?: number | undefined;
  cause?: unknown;
}

/**
 * A request the client gave up on: the server refused it (`status` and the
 * RFC 9457 problem `type`, `title`, `detail`, `fields`) and a retry would not
 * help, or the attempts ran out and this is the last attempt's error.
 * `attempts` is how many requests were sent; `key` the Idempotency-Key they
 * carried (resend under the same key to stay exactly once).
 */
export class OverageError extends Error {
  status: number;
  type: string;
  title: string;
  detail: string;
  fields: FieldError[];
  attempts: number;
  key: string | undefined;
  retryAfterMs: number | undefined;

  constructor(message: string, init: OverageErrorInit = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = "OverageError";
    this.status = init.status ?? 0;
    this.type = init.type ?? "";
    this.title = init.title ?? "";
    this.detail = init.detail ?? "";
    this.fields = init.fields ?? [];
    this.attempts = init.attempts ?? 0;
    this.key = init.key;
    this.retryAfterMs = init.retryAfterMs;
  }

  /** Whether the same request, under the same key, may succeed later. */
  get retryable(): boolean {
    if (this.status === 0) return true;
    if (this.status === 409) return this.type === PROBLEM_IN_PROGRESS;
    return this.status === 429 || this.status >= 500;
  }
}

/**
 * No answer: the connection failed, was closed or the attempt timed out. The
 * request may or may not have been executed; resending it under the same key
 * is safe.
 */
export class TransportError extends OverageError {
  constructor(message: string, init: OverageErrorInit = {}) {
    super(message, init);
    this.name = "TransportError";
  }
}

/** The operation's deadline would pass before the next attempt; the fields are the last attempt's. */
export class DeadlineExceededError extends OverageError {
  constructor(message: string, init: OverageErrorInit = {}) {
    super(message, init);
    this.name = "DeadlineExceededError";
  }
}

/** An alert webhook whose signature is missing, malformed, wrong or too old. */
export class WebhookVerificationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WebhookVerificationError";
  }
}
