"""The shared retry cases, run against a scripted server."""

from __future__ import annotations

import re
import time
import unittest
import uuid
from typing import Any, Dict, List
from unittest import mock

import overage
from overage import Client, DeadlineExceeded, OverageError, TransportError

from scripted_server import ScriptedServer, load_cases

TABLE = load_cases()
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def run_case(case: Dict[str, Any], client_cls: type = Client) -> List[str]:
    """Runs one case and returns what went wrong (nothing when it passed)."""
    cfg = TABLE["client"]
    op = case["operation"]
    inp = TABLE["inputs"][op]
    srv = ScriptedServer(case["script"], TABLE["success_bodies"][op])
    problems: List[str] = []
    try:
        c = client_cls(
            srv.url,
            "ovg_test_key",
            max_attempts=cfg["max_attempts"],
            base_delay=cfg["base_delay_ms"] / 1000,
            max_delay=cfg["max_delay_ms"] / 1000,
            timeout=cfg["timeout_ms"] / 1000,
            deadline=case.get("deadline_ms", 60000) / 1000,
        )
        key = case.get("idempotency_key")
        start = time.monotonic()
        result: Any = None
        err: Any = None
        try:
            if op in ("record", "record_no_request_id"):
                result = c.record(inp, idempotency_key=key)
            elif op == "record_batch":
                result = c.record_batch(inp, idempotency_key=key)
            elif op == "checkpoint":
                s = c.stream(inp["request_id"], inp["user_id"], inp["model_id"])
                result = s.checkpoint(inp["input_tokens"], inp["output_tokens"])
            elif op == "correct":
                result = c.correct(inp["usage_log_id"], inp["input_tokens"], inp["output_tokens"], inp["reason"], idempotency_key=key)
            else:
                raise AssertionError("unknown operation %r" % op)
        except OverageError as e:
            err = e
        elapsed_ms = (time.monotonic() - start) * 1000
        exp = case["expect"]
        seen = srv.seen
        if len(seen) != exp["attempts"]:
            problems.append("%d attempts reached the server, want %d" % (len(seen), exp["attempts"]))
        for i, s in enumerate(seen):
            if s.key != seen[0].key:
                problems.append("attempt %d carried Idempotency-Key %r, the first %r" % (i + 1, s.key, seen[0].key))
            if s.body != seen[0].body:
                problems.append("attempt %d carried another body than the first" % (i + 1))
            if s.auth != "Bearer ovg_test_key":
                problems.append("attempt %d carried Authorization %r" % (i + 1, s.auth))
        if seen:
            want = exp["key"]
            if want == "uuid":
                if not UUID_RE.match(seen[0].key or ""):
                    problems.append("key %r, want a random UUID" % seen[0].key)
            elif seen[0].key != want:
                problems.append("key %r, want %r" % (seen[0].key, want))
        if "min_elapsed_ms" in exp and elapsed_ms < exp["min_elapsed_ms"]:
            problems.append("took %dms, want at least %dms (Retry-After not honoured)" % (elapsed_ms, exp["min_elapsed_ms"]))
        outcome = exp["outcome"]
        if outcome == "ok":
            if err is not None:
                problems.append("failed: %s" % err)
            else:
                if result.attempts != exp["attempts"]:
                    problems.append("result.attempts %d, want %d" % (result.attempts, exp["attempts"]))
                if result.replayed != exp["replayed"]:
                    problems.append("result.replayed %r, want %r" % (result.replayed, exp["replayed"]))
                if seen and result.key != seen[0].key:
                    problems.append("result.key %r, sent %r" % (result.key, seen[0].key))
        elif outcome == "deadline":
            if not isinstance(err, DeadlineExceeded):
                problems.append("outcome %r, want DeadlineExceeded" % (err or result))
        else:
            if err is None or isinstance(err, DeadlineExceeded):
                problems.append("outcome %r, want an error" % (err or result))
            else:
                if err.status != exp["status"]:
                    problems.append("error status %d, want %d (%s)" % (err.status, exp["status"], err))
                if exp["status"] == 0 and not isinstance(err, TransportError):
                    problems.append("error %r, want a TransportError" % err)
                if exp.get("type", "") != err.type:
                    problems.append("error type %r, want %r" % (err.type, exp.get("type", "")))
                if [f.field for f in err.fields] != exp.get("fields", []):
                    problems.append("error fields %r, want %r" % ([f.field for f in err.fields], exp.get("fields", [])))
                if err.attempts != exp["attempts"]:
                    problems.append("error.attempts %d, want %d" % (err.attempts, exp["attempts"]))
    finally:
        srv.close()
    return problems


class RetryCasesTest(unittest.TestCase):
    def test_table(self) -> None:
        self.assertGreater(len(TABLE["cases"]), 10)
        for case in TABLE["cases"]:
            with self.subTest(case["name"]):
                problems = run_case(case)
                self.assertEqual(problems, [], case["name"])


class KeyInsideTheLoop(Client):
    """The double-billing bug: a fresh key minted for every attempt."""

    def _attempt(self, method, path, key, body, timeout):  # type: ignore[no-untyped-def]
        return super()._attempt(method, path, str(uuid.uuid4()) if key else key, body, timeout)


class RetriesKeyReuse(Client):
    """Another: every 409 retried, key reuse included."""

    def _send(self, method, path, key, body):  # type: ignore[no-untyped-def]
        with mock.patch.object(overage.OverageError, "retryable", property(lambda e: e.status in (0, 409, 429) or e.status >= 500)):
            return super()._send(method, path, key, body)


class TheTableCatchesBrokenClientsTest(unittest.TestCase):
    def _failures(self, cls: type) -> List[str]:
        return [c["name"] for c in TABLE["cases"] if run_case(c, cls)]

    def test_key_minted_inside_the_retry_loop_fails(self) -> None:
        failed = self._failures(KeyInsideTheLoop)
        self.assertIn("lost answer is resent under the same key and replayed", failed)
        self.assertIn("a timed-out attempt is resent under the same key", failed)

    def test_retrying_key_reuse_fails(self) -> None:
        self.assertIn("409 key reuse is never retried", self._failures(RetriesKeyReuse))


if __name__ == "__main__":
    unittest.main()
