"""verify_webhook against payloads signed here (test_live.py also checks one
signed by the server's own code: the format is the contract's, t=<unix>,v1=<hex HMAC-SHA256 of
"<t>.<body>">)."""

from __future__ import annotations

import hashlib
import hmac
import json
import unittest

from overage import WebhookVerificationError, sign_webhook, verify_webhook

SECRET = "whsec_test_0123456789abcdef"
BODY = json.dumps({"id": "evt_01", "type": "usage.threshold_crossed", "created": "2026-11-29T10:00:00Z",
                   "data": {"tenant_id": "t", "meter": "input", "period_start": "2026-11-01T00:00:00Z",
                            "threshold_percent": 80, "included": 100000, "used": 80500}}).encode()
NOW = 1_790_000_000


def header(t: int = NOW, body: bytes = BODY, secret: str = SECRET) -> str:
    # Computed here by hand, not with sign_webhook, so a bug shared by the
    # signer and the verifier cannot pass.
    return "t=%d,v1=%s" % (t, hmac.new(secret.encode(), str(t).encode() + b"." + body, hashlib.sha256).hexdigest())


class VerifyWebhookTest(unittest.TestCase):
    def test_valid(self) -> None:
        ev = verify_webhook(BODY, header(), SECRET, now=NOW)
        self.assertEqual(ev["id"], "evt_01")
        self.assertEqual(verify_webhook(BODY.decode(), header(), SECRET, now=NOW + 299)["data"]["used"], 80500)
        self.assertEqual(sign_webhook(BODY, SECRET, NOW), header())

    def test_rotation_any_v1_matches(self) -> None:
        h = header() + ",v1=" + "0" * 64
        verify_webhook(BODY, "t=%d,v1=%s,%s" % (NOW, "f" * 64, h.split(",", 1)[1]), SECRET, now=NOW)

    def test_refusals(self) -> None:
        cases = {
            "tampered body": (BODY.replace(b"80500", b"80501"), header(), SECRET),
            "wrong secret": (BODY, header(), "whsec_other"),
            "too old": (BODY, header(t=NOW - 301), SECRET),
            "from the future": (BODY, header(t=NOW + 301), SECRET),
            "no header": (BODY, "", SECRET),
            "no v1": (BODY, "t=%d" % NOW, SECRET),
            "no t": (BODY, header().split(",", 1)[1], SECRET),
            "malformed t": (BODY, "t=abc,v1=00", SECRET),
            "no secret": (BODY, header(), ""),
        }
        for name, (body, h, secret) in cases.items():
            with self.subTest(name), self.assertRaises(WebhookVerificationError):
                verify_webhook(body, h, secret, now=NOW)


if __name__ == "__main__":
    unittest.main()
