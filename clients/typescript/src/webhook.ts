/** Verification of overage's alert webhooks. */

import { createHmac, timingSafeEqual } from "node:crypto";

import { WebhookVerificationError } from "./errors.js";

/** How old a signature may be, in seconds, by default. */
export const DEFAULT_TOLERANCE_SECONDS = 300;

function bytes(body: string | Uint8Array): Buffer {
  return typeof body === "string" ? Buffer.from(body, "utf8") : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

function mac(secret: string, t: number, body: Buffer): string {
  return createHmac("sha256", secret).update(`${t}.`).update(body).digest("hex");
}

/** The `Overage-Signature` header overage sends with body: for tests of a receiver. */
export function signWebhook(body: string | Uint8Array, secret: string, timestamp: number = Math.floor(Date.now() / 1000)): string {
  return `t=${timestamp},v1=${mac(secret, timestamp, bytes(body))}`;
}

export interface VerifyWebhookOptions {
  /** Seconds a signature's timestamp may be from now; default 300. */
  toleranceSeconds?: number;
  /** Now, in Unix seconds (for tests). */
  now?: number;
}

/**
 * Checks an alert webhook and returns its event.
 *
 * `body` is the request body exactly as received (verify before parsing),
 * `header` the `Overage-Signature` header, `t=<unix seconds>,v1=<hex
 * HMAC-SHA256 of "<t>.<body>">` keyed with the endpoint's whole signing
 * secret (`whsec_...`). Several `v1` entries may be given (during a secret's
 * rotation); one matching is enough. A timestamp more than
 * `toleranceSeconds` from now is refused, so a captured delivery cannot be
 * replayed later. Throws WebhookVerificationError. Deduplicate deliveries on
 * the event's `id`.
 */
export function verifyWebhook(
  body: string | Uint8Array,
  header: string | null | undefined,
  secret: string,
  opts: VerifyWebhookOptions = {},
): Record<string, unknown> {
  if (!secret) throw new WebhookVerificationError("overage: no webhook signing secret given");
  if (!header) throw new WebhookVerificationError("overage: no Overage-Signature header");
  let t: number | undefined;
  const sigs: string[] = [];
  for (const part of header.split(",")) {
    const i = part.indexOf("=");
    if (i < 0) continue;
    const k = part.slice(0, i).trim();
    const v = part.slice(i + 1).trim();
    if (k === "t") {
      if (!/^\d+$/.test(v)) throw new WebhookVerificationError(`overage: Overage-Signature has a malformed timestamp ${JSON.stringify(v)}`);
      t = Number(v);
    } else if (k === "v1") {
      sigs.push(v);
    }
  }
  if (t === undefined || sigs.length === 0) {
    throw new WebhookVerificationError("overage: Overage-Signature must be t=<unix seconds>,v1=<hex signature>");
  }
  const tolerance = opts.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS;
  const now = opts.now ?? Date.now() / 1000;
  if (Math.abs(now - t) > tolerance) {
    throw new WebhookVerificationError(`overage: the signature's timestamp is ${Math.round(now - t)}s from now, over the tolerance of ${tolerance}s`);
  }
  const raw = bytes(body);
  const expected = Buffer.from(mac(secret, t, raw), "utf8");
  const ok = sigs.some((s) => {
    const got = Buffer.from(s, "utf8");
    return got.length === expected.length && timingSafeEqual(got, expected);
  });
  if (!ok) throw new WebhookVerificationError("overage: no Overage-Signature v1 matches the body and secret");
  let event: unknown;
  try {
    event = JSON.parse(raw.toString("utf8"));
  } catch (e) {
    throw new WebhookVerificationError(`overage: the signed body is not JSON: ${(e as Error).message}`);
  }
  if (event === null || typeof event !== "object" || Array.isArray(event)) {
    throw new WebhookVerificationError("overage: the signed body is not a JSON object");
  }
  return event as Record<string, unknown>;
}
