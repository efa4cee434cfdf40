// verifyWebhook against payloads signed here (live.test.mjs also checks one
// signed by the server's own code: the format is t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">).

import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { describe, it } from "node:test";

import { WebhookVerificationError, signWebhook, verifyWebhook } from "../dist/index.js";

const SECRET = "whsec_test_0123456789abcdef";
const BODY = JSON.stringify({ id: "evt_01", type: "usage.threshold_crossed", created: "2026-11-29T10:00:00Z",
  data: { tenant_id: "t", meter: "input", period_start: "2026-11-01T00:00:00Z", threshold_percent: 80, included: 100000, used: 80500 } });
const NOW = 1_790_000_000;
// By hand, not with signWebhook, so a bug shared by signer and verifier cannot pass.
const header = (t = NOW, body = BODY, secret = SECRET) => `t=${t},v1=${createHmac("sha256", secret).update(`${t}.${body}`).digest("hex")}`;

describe("verifyWebhook", () => {
  it("accepts a valid signature and returns the event", () => {
    assert.equal(verifyWebhook(BODY, header(), SECRET, { now: NOW }).id, "evt_01");
    assert.equal(verifyWebhook(new TextEncoder().encode(BODY), header(), SECRET, { now: NOW + 299 }).data.used, 80500);
    assert.equal(signWebhook(BODY, SECRET, NOW), header());
  });
  it("accepts any matching v1 (secret rotation)", () => {
    const sig = header().split(",")[1];
    verifyWebhook(BODY, `t=${NOW},v1=${"f".repeat(64)},${sig}`, SECRET, { now: NOW });
  });
  const refusals = {
    "tampered body": [BODY.replace("80500", "80501"), header(), SECRET],
    "wrong secret": [BODY, header(), "whsec_other"],
    "too old": [BODY, header(NOW - 301), SECRET],
    "from the future": [BODY, header(NOW + 301), SECRET],
    "no header": [BODY, "", SECRET],
    "no v1": [BODY, `t=${NOW}`, SECRET],
    "no t": [BODY, header().split(",")[1], SECRET],
    "malformed t": [BODY, "t=abc,v1=00", SECRET],
    "no secret": [BODY, header(), ""],
  };
  for (const [name, [body, h, secret]] of Object.entries(refusals)) {
    it(`refuses: ${name}`, () => assert.throws(() => verifyWebhook(body, h, secret, { now: NOW }), WebhookVerificationError));
  }
});
