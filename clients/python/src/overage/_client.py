"""The overage client: usage events sent exactly once over HTTP."""

from __future__ import annotations

import datetime as _dt
import email.utils
import http.client
import json
import random
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ._errors import (
    DeadlineExceeded,
    FieldError,
    OverageError,
    TransportError,
)

__all__ = [
    "Client",
    "RecordResult",
    "BatchResult",
    "CheckpointResult",
    "CorrectionResult",
    "Stream",
    "Usage",
    "MeterUsage",
    "MAX_BATCH_EVENTS",
]

#: The most events one ``record_batch`` call may send.
MAX_BATCH_EVENTS = 1000

_EVENT_FIELDS = (
    "request_id",
    "timestamp",
    "user_id",
    "model_id",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_output_tokens",
    "tenant_id",
)
_OPTIONAL_COUNTS = ("cache_read_input_tokens", "cache_creation_input_tokens", "reasoning_output_tokens")


@dataclass
class RecordResult:
    """The outcome of ``record``."""

    #: The usage log as the server answered it (``id``, ``overage``,
    #: ``billing_status``, ...).
    log: Dict[str, Any]
    #: The server answered with the stored outcome of an earlier attempt
    #: under the same key (the first answer was lost, say).
    replayed: bool
    #: The request_id was already recorded under another key; nothing new
    #: was recorded or billed.
    duplicate: bool
    #: The Idempotency-Key used, and how many requests it took.
    key: str
    attempts: int


@dataclass
class BatchResult:
    """The outcome of ``record_batch``: one answer per event, in order."""

    events: List[Dict[str, Any]]
    created: int
    duplicates: int
    replayed: bool
    key: str
    attempts: int


@dataclass
class CheckpointResult:
    """The outcome of one stream checkpoint."""

    #: The usage log of the increase (or, for a final checkpoint that only
    #: lowered a total, the correction); None when nothing was recorded.
    log: Optional[Dict[str, Any]]
    #: The correction a final checkpoint recorded besides an increase.
    correction: Optional[Dict[str, Any]]
    #: The server already held a checkpoint at or after this one.
    stale: bool
    #: Where the stream stands: sequence, final, input_tokens,
    #: output_tokens, closed.
    stream: Dict[str, Any]
    sequence: int
    key: str
    replayed: bool
    attempts: int


@dataclass
class CorrectionResult:
    """The outcome of ``correct``: the new usage log of kind correction."""

    log: Dict[str, Any]
    #: "original" (the original's time) or "correction" (the time of the
    #: correction): which time the Stripe meter event carries.
    stripe_timestamp: str
    replayed: bool
    key: str
    attempts: int


@dataclass
class MeterUsage:
    """One meter's usage in a period."""

    meter: str
    event_name: str
    included: int
    used: int
    remaining: int
    overage: int
    billed: int
    pending: int


@dataclass
class Usage:
    """The answer of ``usage``: a tenant's usage so far in a period."""

    tenant_id: str
    period_start: str
    period_end: str
    meters: List[MeterUsage] = field(default_factory=list)


def _now_rfc3339() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _timestamp(v: Any) -> str:
    if isinstance(v, _dt.datetime):
        if v.tzinfo is None:
            raise ValueError("overage: timestamp must be timezone-aware (a naive datetime is ambiguous)")
        return v.astimezone(_dt.timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(v, str):
        return v
    raise TypeError("overage: timestamp must be a datetime or an RFC 3339 string, got %r" % (type(v).__name__,))


def _event(ev: Mapping[str, Any], now: str) -> Dict[str, Any]:
    unknown = sorted(set(ev) - set(_EVENT_FIELDS))
    if unknown:
        raise TypeError("overage: unknown event field(s): %s" % ", ".join(unknown))
    out: Dict[str, Any] = {}
    for k in _EVENT_FIELDS:
        v = ev.get(k)
        if v is None:
            continue
        if k in _OPTIONAL_COUNTS and v == 0:
            continue  # absent and 0 mean the same; older servers know no such field
        out[k] = v
    out["timestamp"] = _timestamp(ev["timestamp"]) if ev.get("timestamp") is not None else now
    return out


def _encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _retry_after(v: Optional[str]) -> Optional[float]:
    if not v:
        return None
    v = v.strip()
    if v.isdigit():
        return float(v)
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return max(0.0, (when - _dt.datetime.now(_dt.timezone.utc)).total_seconds())


def _problem(status: int, raw: bytes, retry_after: Optional[float]) -> OverageError:
    title = http.client.responses.get(status, "HTTP %d" % status)
    typ = detail = ""
    fields: List[FieldError] = []
    try:
        p = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        p = None
    if isinstance(p, dict):
        typ = str(p.get("type") or "")
        title = str(p.get("title") or title)
        detail = str(p.get("detail") or "")
        for f in p.get("errors") or []:
            if isinstance(f, dict):
                fields.append(FieldError(field=str(f.get("field", "")), detail=str(f.get("detail", ""))))
    msg = "overage: %d %s" % (status, title)
    if detail:
        msg += ": " + detail
    if typ:
        msg += " (%s)" % typ
    return OverageError(msg, status=status, type=typ, title=title, detail=detail, fields=fields, retry_after=retry_after)


class Client:
    """Reports usage events to an overage server. Safe to share between
    threads.

    One logical operation gets one Idempotency-Key, fixed with its body
    before the first attempt and resent unchanged on every retry: the
    caller's ``idempotency_key``, else the event's ``request_id``, else a
    random UUID. Transport errors, 5xx, 429 and 409 in progress are retried
    with exponential backoff and full jitter (``base_delay * 2**n`` capped
    at ``max_delay``), or after the server's ``Retry-After``; any other
    answer is final. At most ``max_attempts`` requests are sent, each with
    ``timeout`` seconds, within ``deadline`` seconds in all.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        max_attempts: int = 8,
        base_delay: float = 0.1,
        max_delay: float = 10.0,
        deadline: float = 120.0,
        opener: Optional[urllib.request.OpenerDirector] = None,
        user_agent: str = "overage-python/0.1.0",
    ) -> None:
        if not base_url:
            raise ValueError("overage: base_url is required (e.g. http://127.0.0.1:8080)")
        if not api_key:
            raise ValueError("overage: api_key is required (the tenant's API key)")
        if max_attempts < 1:
            raise ValueError("overage: max_attempts must be at least 1")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.deadline = deadline
        self._opener = opener or urllib.request.build_opener()
        self._user_agent = user_agent
        # Tests replace these to observe waits without sleeping.
        self._sleep: Callable[[float], None] = time.sleep
        self._clock: Callable[[], float] = time.monotonic

    # -- operations ---------------------------------------------------

    def record(self, event: Optional[Mapping[str, Any]] = None, *, idempotency_key: Optional[str] = None, **fields: Any) -> RecordResult:
        """Records one LLM call's usage: ``record(request_id=..., user_id=...,
        model_id=..., input_tokens=..., output_tokens=...)``, or a mapping of
        those fields. ``timestamp`` defaults to now, fixed before the first
        attempt so a retry reports the same instant."""
        ev = dict(event or {})
        ev.update(fields)
        body = _event(ev, _now_rfc3339())
        key = idempotency_key or body.get("request_id") or str(uuid.uuid4())
        status, headers, log, attempts = self._send("POST", "/v1/usage-events", key, _encode(body))
        return RecordResult(log=log, replayed=_replayed(headers), duplicate=bool(log.get("duplicate")), key=key, attempts=attempts)

    def record_batch(self, events: Sequence[Mapping[str, Any]], *, idempotency_key: Optional[str] = None) -> BatchResult:
        """Records 1 to 1,000 events in one request and one transaction.
        Every event needs a ``request_id``, unique in the batch: that is
        what makes sending them again, regrouped under a new key, safe."""
        if not 1 <= len(events) <= MAX_BATCH_EVENTS:
            raise ValueError("overage: a batch holds 1 to %d events, got %d" % (MAX_BATCH_EVENTS, len(events)))
        now = _now_rfc3339()
        out = []
        for i, ev in enumerate(events):
            if not ev.get("request_id"):
                raise ValueError("overage: batch event %d has no request_id; every batched event needs one" % i)
            out.append(_event(ev, now))
        key = idempotency_key or str(uuid.uuid4())
        _, headers, ans, attempts = self._send("POST", "/v1/usage-events/batch", key, _encode({"events": out}))
        return BatchResult(
            events=list(ans.get("events") or []),
            created=int(ans.get("created", 0)),
            duplicates=int(ans.get("duplicates", 0)),
            replayed=_replayed(headers),
            key=key,
            attempts=attempts,
        )

    def stream(self, request_id: str, user_id: str, model_id: str) -> "Stream":
        """Starts reporting a streamed response identified by request_id
        (the provider's response id) as cumulative checkpoints."""
        if not request_id:
            raise ValueError("overage: a stream needs a request_id")
        return Stream(self, request_id, user_id, model_id)

    def correct(
        self,
        usage_log_id: str,
        input_tokens: int,
        output_tokens: int,
        reason: str,
        *,
        idempotency_key: Optional[str] = None,
    ) -> CorrectionResult:
        """Corrects a usage log to these totals (0 and 0 void it). The
        server records the difference as a new usage log of kind
        correction."""
        if not usage_log_id:
            raise ValueError("overage: correct needs the usage log id")
        key = idempotency_key or str(uuid.uuid4())
        body = _encode({"input_tokens": input_tokens, "output_tokens": output_tokens, "reason": reason})
        path = "/v1/usage-events/%s/corrections" % urllib.parse.quote(usage_log_id, safe="")
        _, headers, log, attempts = self._send("POST", path, key, body)
        return CorrectionResult(log=log, stripe_timestamp=str(log.get("stripe_timestamp", "")), replayed=_replayed(headers), key=key, attempts=attempts)

    def usage(self, *, period_start: Optional[str] = None, tenant_id: Optional[str] = None) -> Usage:
        """The tenant's usage so far in the current period (or the one
        starting at period_start), per meter. ``tenant_id`` is for an
        admin token."""
        q = {k: v for k, v in (("tenant_id", tenant_id), ("period_start", period_start)) if v}
        path = "/v1/usage" + ("?" + urllib.parse.urlencode(q) if q else "")
        _, _, ans, _ = self._send("GET", path, None, None)
        period = ans.get("period") or {}
        meters = [
            MeterUsage(
                meter=str(m.get("meter", "")),
                event_name=str(m.get("event_name", "")),
                included=int(m.get("included") or 0),
                used=int(m.get("used") or 0),
                remaining=int(m.get("remaining") or 0),
                overage=int(m.get("overage") or 0),
                billed=int(m.get("billed") or 0),
                pending=int(m.get("pending") or 0),
            )
            for m in ans.get("meters") or []
        ]
        return Usage(tenant_id=str(ans.get("tenant_id", "")), period_start=str(period.get("start", "")), period_end=str(period.get("end", "")), meters=meters)

    # -- the retry loop -----------------------------------------------

    def _send(self, method: str, path: str, key: Optional[str], body: Optional[bytes]) -> Tuple[int, http.client.HTTPMessage, Dict[str, Any], int]:
        """Sends the same request (key and body fixed by the caller) until it
        is answered 2xx, refused, the attempts run out or the deadline
        passes."""
        end = self._clock() + self.deadline
        attempt = 0
        while True:
            attempt += 1
            remaining = end - self._clock()
            try:
                status, headers, ans = self._attempt(method, path, key, body, max(0.001, min(self.timeout, remaining)))
                return status, headers, ans, attempt
            except OverageError as e:
                e.attempts, e.key = attempt, key
                if not e.retryable or attempt >= self.max_attempts:
                    raise
                wait = e.retry_after if e.retry_after is not None else self._backoff(attempt)
                if self._clock() + wait >= end:
                    raise DeadlineExceeded(
                        "overage: the deadline of %gs would pass before the next attempt; last: %s" % (self.deadline, e),
                        status=e.status,
                        type=e.type,
                        title=e.title,
                        detail=e.detail,
                        fields=e.fields,
                        attempts=attempt,
                        key=key,
                    ) from e
                self._sleep(wait)

    def _backoff(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_delay, self.base_delay * (2 ** min(attempt - 1, 30))))

    def _attempt(self, method: str, path: str, key: Optional[str], body: Optional[bytes], timeout: float) -> Tuple[int, http.client.HTTPMessage, Dict[str, Any]]:
        req = urllib.request.Request(self.base_url + path, data=body, method=method)
        req.add_header("Authorization", "Bearer " + self._api_key)
        req.add_header("Accept", "application/json")
        req.add_header("User-Agent", self._user_agent)
        if key is not None:
            req.add_header("Idempotency-Key", key)
        if body is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(req, timeout=timeout) as res:
                raw = res.read()
                status, headers = res.status, res.headers
        except urllib.error.HTTPError as e:
            with e:
                try:
                    raw = e.read()
                except (OSError, http.client.HTTPException):
                    raw = b""
                raise _problem(e.code, raw, _retry_after(e.headers.get("Retry-After"))) from None
        except (urllib.error.URLError, http.client.HTTPException, socket.timeout, OSError) as e:
            reason = getattr(e, "reason", e)
            raise TransportError("overage: no answer from %s: %s" % (self.base_url, reason)) from e
        try:
            ans = json.loads(raw.decode("utf-8")) if raw else {}
        except (UnicodeDecodeError, ValueError) as e:
            raise OverageError("overage: %d answer is not JSON: %s" % (status, e), status=status) from e
        if not isinstance(ans, dict):
            raise OverageError("overage: %d answer is not a JSON object" % status, status=status)
        return status, headers, ans


def _replayed(headers: Any) -> bool:
    return (headers.get("Idempotent-Replayed") or "").lower() == "true"


class Stream:
    """Reports one streamed LLM response as cumulative checkpoints.

    Call ``checkpoint`` with the totals so far as the answer streams (each
    records only the increase, so a checkpoint lost for good loses nothing:
    the next carries the totals), then ``final`` with the provider's
    authoritative usage, which may be lower (the server records the
    difference as a correction). Checkpoint n is sent under the key
    ``<request_id>:<n>``, numbered from 0 in call order, with ``record``'s
    retry rules. Safe to share between threads.
    """

    def __init__(self, client: Client, request_id: str, user_id: str, model_id: str) -> None:
        self._client = client
        self.request_id = request_id
        self.user_id = user_id
        self.model_id = model_id
        self._lock = threading.Lock()
        self._next = 0

    def checkpoint(self, input_tokens: int, output_tokens: int, **counts: int) -> CheckpointResult:
        """Reports the totals so far. ``counts`` are the optional
        cumulative ``cache_read_input_tokens``, ``cache_creation_input_tokens``
        and ``reasoning_output_tokens``."""
        return self._send(input_tokens, output_tokens, False, counts)

    def final(self, input_tokens: int, output_tokens: int, **counts: int) -> CheckpointResult:
        """Reports the response's final usage; nothing is recorded after it."""
        return self._send(input_tokens, output_tokens, True, counts)

    def _send(self, input_tokens: int, output_tokens: int, final: bool, counts: Mapping[str, int]) -> CheckpointResult:
        unknown = sorted(set(counts) - set(_OPTIONAL_COUNTS))
        if unknown:
            raise TypeError("overage: unknown checkpoint count(s): %s" % ", ".join(unknown))
        with self._lock:
            seq = self._next
            self._next += 1
        ev = dict(counts, request_id=self.request_id, user_id=self.user_id, model_id=self.model_id, input_tokens=input_tokens, output_tokens=output_tokens)
        body = _event(ev, _now_rfc3339())
        body["stream"] = {"sequence": seq, "final": final}
        key = "%s:%d" % (self.request_id, seq)
        _, headers, ans, attempts = self._client._send("POST", "/v1/usage-events", key, _encode(body))
        stream = ans.get("stream")
        if stream is None:
            # A plain event recorded this request id first: the server
            # answered with its log as a duplicate.
            return CheckpointResult(log=ans, correction=None, stale=False, stream={}, sequence=seq, key=key, replayed=_replayed(headers), attempts=attempts)
        return CheckpointResult(
            log=ans if ans.get("id") else None,
            correction=ans.get("correction"),
            stale=bool(ans.get("stale")),
            stream=dict(stream),
            sequence=seq,
            key=key,
            replayed=_replayed(headers),
            attempts=attempts,
        )
