"""The client's surface against a scripted server: what it sends and how it
reads the answers."""

from __future__ import annotations

import datetime as dt
import json
import unittest

from overage import Client, MeterUsage, OverageError

from scripted_server import ScriptedServer

USAGE = {"tenant_id": "t1", "period": {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"},
         "meters": [{"meter": "input", "event_name": "llm_input_tokens", "included": 100000, "used": 80500,
                     "remaining": 19500, "overage": 0, "billed": 0, "pending": 0}]}


class ClientTest(unittest.TestCase):
    def serve(self, *script: dict) -> ScriptedServer:
        srv = ScriptedServer(list(script))
        self.addCleanup(srv.close)
        return srv

    def client(self, srv: ScriptedServer) -> Client:
        return Client(srv.url + "/", "ovg_k", base_delay=0.001, max_delay=0.002, max_attempts=3)

    def test_record_sends_the_event_with_a_fixed_timestamp(self) -> None:
        srv = self.serve({"status": 202, "body": {"id": "l1", "duplicate": False}})
        when = dt.datetime(2026, 11, 29, 10, 0, tzinfo=dt.timezone.utc)
        r = self.client(srv).record(request_id="r1", user_id="u", model_id="m", input_tokens=5, output_tokens=1,
                                    cache_read_input_tokens=0, reasoning_output_tokens=None, timestamp=when)
        self.assertEqual((r.log["id"], r.replayed, r.duplicate, r.key, r.attempts), ("l1", False, False, "r1", 1))
        sent = json.loads(srv.seen[0].body)
        self.assertEqual(sent, {"request_id": "r1", "user_id": "u", "model_id": "m", "input_tokens": 5, "output_tokens": 1,
                                "timestamp": "2026-11-29T10:00:00Z"})
        self.assertEqual(srv.seen[0].path, "/v1/usage-events")

    def test_record_defaults_the_timestamp_to_now(self) -> None:
        srv = self.serve({"status": 200, "body": {"id": "l1", "duplicate": True}})
        r = self.client(srv).record({"request_id": "r1", "user_id": "u", "model_id": "m", "input_tokens": 5, "output_tokens": 1})
        self.assertTrue(r.duplicate)
        ts = dt.datetime.fromisoformat(json.loads(srv.seen[0].body)["timestamp"].replace("Z", "+00:00"))
        self.assertLess(abs((dt.datetime.now(dt.timezone.utc) - ts).total_seconds()), 60)

    def test_input_checked_before_sending(self) -> None:
        srv = self.serve()
        c = self.client(srv)
        with self.assertRaises(TypeError):
            c.record(request_id="r", user_id="u", model_id="m", input_tokens=1, output_tokens=1, input_token=3)
        with self.assertRaisesRegex(ValueError, "request_id"):
            c.record_batch([{"user_id": "u", "model_id": "m", "input_tokens": 1, "output_tokens": 1}])
        with self.assertRaises(ValueError):
            c.record_batch([])
        with self.assertRaises(ValueError):
            c.stream("", "u", "m")
        with self.assertRaises(ValueError):
            c.record(request_id="r", user_id="u", model_id="m", input_tokens=1, output_tokens=1, timestamp=dt.datetime(2026, 1, 1))
        self.assertEqual(srv.seen, [])

    def test_stream_numbers_its_checkpoints(self) -> None:
        tot = {"sequence": 0, "final": False, "input_tokens": 10, "output_tokens": 2, "closed": False}
        srv = self.serve({"status": 202, "body": {"id": "l1", "stale": False, "stream": tot}},
                         {"status": 200, "body": {"stale": True, "stream": tot}},
                         {"status": 202, "body": {"id": "l2", "stale": False, "stream": dict(tot, final=True, closed=True),
                                                  "correction": {"id": "l3"}}})
        s = self.client(srv).stream("chatcmpl-9", "u", "m")
        a, b, c = s.checkpoint(10, 2), s.checkpoint(10, 2), s.final(12, 1, reasoning_output_tokens=1)
        self.assertEqual([x.key for x in (a, b, c)], ["chatcmpl-9:0", "chatcmpl-9:1", "chatcmpl-9:2"])
        self.assertEqual((a.log["id"], a.stale, b.log, b.stale, c.correction["id"], c.stream["closed"]), ("l1", False, None, True, "l3", True))
        bodies = [json.loads(x.body) for x in srv.seen]
        self.assertEqual([x["stream"] for x in bodies], [{"sequence": 0, "final": False}, {"sequence": 1, "final": False}, {"sequence": 2, "final": True}])
        self.assertEqual(bodies[2]["reasoning_output_tokens"], 1)

    def test_correct(self) -> None:
        srv = self.serve({"status": 202, "body": {"id": "c1", "kind": "correction", "stripe_timestamp": "original"}})
        r = self.client(srv).correct("log/1", 10, 0, "recount", idempotency_key="fix-1")
        self.assertEqual((r.log["id"], r.stripe_timestamp, r.key), ("c1", "original", "fix-1"))
        self.assertEqual(srv.seen[0].path, "/v1/usage-events/log%2F1/corrections")
        self.assertEqual(json.loads(srv.seen[0].body), {"input_tokens": 10, "output_tokens": 0, "reason": "recount"})

    def test_usage_is_read_and_retried(self) -> None:
        srv = self.serve({"status": 503, "body": {"type": "x", "title": "down"}}, {"status": 200, "body": USAGE})
        u = self.client(srv).usage(period_start="2026-11-01T00:00:00Z")
        self.assertEqual((u.tenant_id, u.period_start, u.period_end), ("t1", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z"))
        self.assertEqual(u.meters, [MeterUsage("input", "llm_input_tokens", 100000, 80500, 19500, 0, 0, 0)])
        self.assertEqual([(s.method, s.path, s.key) for s in srv.seen], [("GET", "/v1/usage?period_start=2026-11-01T00%3A00%3A00Z", None)] * 2)

    def test_usage_refusal(self) -> None:
        srv = self.serve({"status": 401, "content_type": "application/problem+json",
                          "body": {"type": "https://overage.dev/problems/unauthorized", "title": "Unauthorized", "status": 401}})
        with self.assertRaises(OverageError) as cm:
            self.client(srv).usage()
        self.assertEqual((cm.exception.status, cm.exception.type, cm.exception.attempts), (401, "https://overage.dev/problems/unauthorized", 1))

    def test_waits_use_backoff_capped_by_max_delay(self) -> None:
        srv = self.serve(*[{"status": 500, "body": {}}] * 5)
        c = Client(srv.url, "k", base_delay=1, max_delay=3, max_attempts=5)
        waits = []
        c._sleep = waits.append
        with self.assertRaises(OverageError):
            c.record(request_id="r", user_id="u", model_id="m", input_tokens=1, output_tokens=1)
        self.assertEqual(len(waits), 4)
        for i, w in enumerate(waits):
            self.assertTrue(0 <= w <= min(3, 2 ** i), (i, w))


if __name__ == "__main__":
    unittest.main()
