"""The client against a real `overage serve`.

`go test ./clients/clientstest` starts the server on a fresh database,
creates a tenant and runs this file with:

  OVERAGE_URL        the server
  OVERAGE_API_KEY    the tenant's key
  OVERAGE_LOSSY_URL  a proxy to it that lets the server execute the first
                     request of each Idempotency-Key, then closes the
                     connection without its answer (the lost answer)

Without them the tests are skipped, saying so; the Go test fails on a skip.
"""

from __future__ import annotations

import datetime
import json
import os
import unittest
import urllib.request
import uuid

from overage import PROBLEM_KEY_REUSED, PROBLEM_STREAM_CLOSED, Client, OverageError, WebhookVerificationError, verify_webhook

URL = os.environ.get("OVERAGE_URL", "")
KEY = os.environ.get("OVERAGE_API_KEY", "")
LOSSY = os.environ.get("OVERAGE_LOSSY_URL", "")


@unittest.skipUnless(URL and KEY and LOSSY, "set OVERAGE_URL, OVERAGE_API_KEY and OVERAGE_LOSSY_URL (go test ./clients/clientstest does)")
class LiveTest(unittest.TestCase):
    def setUp(self) -> None:
        self.c = Client(URL, KEY, base_delay=0.01, max_delay=0.1, deadline=30)
        self.rid = "py-" + uuid.uuid4().hex[:12]
        # Fixed, so that sending an event again sends the same body: a
        # default timestamp is "now", fixed per call, not per event.
        self.at = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)

    def logs_of(self, request_id: str) -> list:
        req = urllib.request.Request(URL + "/v1/usage-events?request_id=" + request_id, headers={"Authorization": "Bearer " + KEY})
        with urllib.request.urlopen(req, timeout=10) as res:
            return json.load(res)["usage_events"]

    def event(self, request_id: str, **kw: int) -> dict:
        return dict({"request_id": request_id, "timestamp": self.at, "user_id": "u_42", "model_id": "gpt-4o", "input_tokens": 1200, "output_tokens": 350}, **kw)

    def test_record_then_duplicate_and_key_reuse(self) -> None:
        r = self.c.record(**self.event(self.rid))
        self.assertEqual((r.replayed, r.duplicate, r.key, r.attempts), (False, False, self.rid, 1))
        self.assertEqual(r.log["billing_status"], "pending")
        self.assertEqual(r.log["overage"], {"input_tokens": 1200, "output_tokens": 350})
        again = self.c.record(**self.event(self.rid))
        self.assertTrue(again.replayed)
        self.assertEqual(again.log["id"], r.log["id"])
        dup = self.c.record(self.event(self.rid), idempotency_key=self.rid + "-other")
        self.assertEqual((dup.duplicate, dup.replayed, dup.log["id"]), (True, False, r.log["id"]))
        with self.assertRaises(OverageError) as cm:
            self.c.record(self.event(self.rid, input_tokens=1), idempotency_key=self.rid)
        self.assertEqual((cm.exception.status, cm.exception.type, cm.exception.attempts), (409, PROBLEM_KEY_REUSED, 1))
        self.assertEqual(len(self.logs_of(self.rid)), 1)

    def test_usage_counts_what_was_recorded(self) -> None:
        before = {m.meter: m for m in self.c.usage().meters}
        self.c.record(**self.event(self.rid, input_tokens=1234, output_tokens=56))
        u = self.c.usage()
        after = {m.meter: m for m in u.meters}
        self.assertEqual(after["input"].used - before["input"].used, 1234)
        self.assertEqual(after["output"].used - before["output"].used, 56)
        self.assertEqual(after["input"].event_name, "llm_input_tokens")
        self.assertLess(u.period_start, u.period_end)

    def test_verifies_the_servers_signature(self) -> None:
        body = os.environ["OVERAGE_WEBHOOK_BODY"].encode()
        header, secret = os.environ["OVERAGE_WEBHOOK_SIGNATURE"], os.environ["OVERAGE_WEBHOOK_SECRET"]
        self.assertEqual(verify_webhook(body, header, secret)["data"]["used"], 80500)
        with self.assertRaises(WebhookVerificationError):
            verify_webhook(body.replace(b"80500", b"80501"), header, secret)

    def test_invalid_event_names_its_field(self) -> None:
        with self.assertRaises(OverageError) as cm:
            self.c.record(**self.event(self.rid, input_tokens=0, output_tokens=0))
        self.assertIn(cm.exception.status, (400, 422))
        self.assertEqual(cm.exception.attempts, 1)
        self.assertTrue(cm.exception.fields, cm.exception)

    def test_lost_answer_is_replayed_and_recorded_once(self) -> None:
        lossy = Client(LOSSY, KEY, base_delay=0.01, max_delay=0.1, deadline=30)
        r = lossy.record(**self.event(self.rid))
        self.assertEqual((r.replayed, r.attempts), (True, 2))
        self.assertEqual([l["id"] for l in self.logs_of(self.rid)], [r.log["id"]])
        # Without a request_id the client mints the key, once.
        n = lossy.record(user_id="u_42", model_id="gpt-4o", input_tokens=7, output_tokens=1)
        self.assertEqual((n.replayed, n.attempts, len(n.key)), (True, 2, 36))

    def test_batch_lost_answer_and_regrouped(self) -> None:
        lossy = Client(LOSSY, KEY, base_delay=0.01, max_delay=0.1, deadline=30)
        evs = [self.event(self.rid + "-" + s, input_tokens=100 + i) for i, s in enumerate("abc")]
        b = lossy.record_batch(evs)
        self.assertEqual((b.replayed, b.attempts, b.created, b.duplicates), (True, 2, 3, 0))
        self.assertEqual([e["index"] for e in b.events], [0, 1, 2])
        again = self.c.record_batch([self.event(self.rid + "-d")] + evs[1:])
        self.assertEqual((again.created, again.duplicates), (1, 2))
        self.assertEqual([e["duplicate"] for e in again.events], [False, True, True])
        self.assertEqual(again.events[1]["id"], b.events[1]["id"])

    def test_stream(self) -> None:
        s = self.c.stream(self.rid, "u_42", "gpt-4o")
        a = s.checkpoint(100, 10)
        self.assertEqual((a.key, a.stale, a.log["input_tokens"], a.stream["input_tokens"]), (self.rid + ":0", False, 100, 100))
        b = s.checkpoint(250, 40)
        self.assertEqual((b.log["input_tokens"], b.log["output_tokens"], b.stream["output_tokens"]), (150, 30, 40))
        f = s.final(240, 45)
        self.assertTrue(f.stream["final"])
        self.assertEqual((f.stream["input_tokens"], f.stream["output_tokens"]), (240, 45))
        with self.assertRaises(OverageError) as cm:
            s.checkpoint(300, 50)
        self.assertEqual((cm.exception.status, cm.exception.type), (409, PROBLEM_STREAM_CLOSED))
        logs = self.logs_of(self.rid)
        self.assertEqual(sum(l["input_tokens"] for l in logs), 240)
        self.assertEqual(sum(l["output_tokens"] for l in logs), 45)

    def test_correction(self) -> None:
        r = self.c.record(**self.event(self.rid))
        fix = self.c.correct(r.log["id"], 1000, 350, "provider re-counted")
        self.assertEqual(fix.log["corrects"], r.log["id"])
        self.assertEqual((fix.log["input_tokens"], fix.log["output_tokens"]), (-200, 0))
        self.assertEqual(fix.stripe_timestamp, "original")  # the period is open
        again = self.c.correct(r.log["id"], 1000, 350, "provider re-counted", idempotency_key=fix.key)
        self.assertEqual((again.replayed, again.log["id"]), (True, fix.log["id"]))


if __name__ == "__main__":
    unittest.main()
