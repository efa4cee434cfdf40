"""Usage events from provider responses."""

from __future__ import annotations

import datetime as _dt
from typing import Any, Dict, Mapping, Optional

__all__ = ["from_openai", "from_anthropic"]


def _plain(obj: Any) -> Any:
    """A provider SDK's response object as plain dicts (pydantic models
    have model_dump, older SDKs to_dict); dicts pass through."""
    if obj is None or isinstance(obj, Mapping):
        return obj
    for name in ("model_dump", "to_dict", "dict"):
        f = getattr(obj, name, None)
        if callable(f):
            return f()
    raise TypeError("overage: expected a provider response as a dict or SDK object, got %r" % (type(obj).__name__,))


def _int(m: Optional[Mapping[str, Any]], key: str) -> int:
    if not m:
        return 0
    v = m.get(key)
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("overage: usage.%s must be an integer, got %r" % (key, v))
    return v


def _put_counts(ev: Dict[str, Any], **counts: int) -> Dict[str, Any]:
    for k, v in counts.items():
        if v:
            ev[k] = v
    return ev


def from_openai(response: Any) -> Dict[str, Any]:
    """The usage event of an OpenAI chat completion, the final chunk of a
    streamed one (sent with ``stream_options={"include_usage": True}``), or
    a Responses API response: ``request_id`` (its ``id``), ``model_id``,
    ``input_tokens`` (``prompt_tokens``), ``output_tokens``
    (``completion_tokens``) and, where present,
    ``cache_read_input_tokens`` (``prompt_tokens_details.cached_tokens``)
    and ``reasoning_output_tokens``
    (``completion_tokens_details.reasoning_tokens``), which OpenAI already
    counts inside the totals; ``timestamp`` from its ``created`` (or
    ``created_at``), so reporting the same response again sends the same
    body and is answered with the stored outcome, not a key reuse. Add
    ``user_id`` and pass it to ``record``."""
    r = _plain(response)
    usage = _plain(r.get("usage")) if r else None
    if not usage:
        raise ValueError(
            "overage: the OpenAI response has no usage (a streamed response reports it only in its last chunk, "
            'and only when requested with stream_options={"include_usage": true})'
        )
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        inp, out = _int(usage, "prompt_tokens"), _int(usage, "completion_tokens")
        in_details, out_details = _plain(usage.get("prompt_tokens_details")), _plain(usage.get("completion_tokens_details"))
    else:  # the Responses API
        inp, out = _int(usage, "input_tokens"), _int(usage, "output_tokens")
        in_details, out_details = _plain(usage.get("input_tokens_details")), _plain(usage.get("output_tokens_details"))
    ev: Dict[str, Any] = {"request_id": r.get("id"), "model_id": r.get("model"), "input_tokens": inp, "output_tokens": out}
    created = r.get("created", r.get("created_at"))
    if isinstance(created, int) and not isinstance(created, bool) and created > 0:
        ev["timestamp"] = _dt.datetime.fromtimestamp(created, _dt.timezone.utc).isoformat().replace("+00:00", "Z")
    return _put_counts(
        ev,
        cache_read_input_tokens=_int(in_details, "cached_tokens"),
        reasoning_output_tokens=_int(out_details, "reasoning_tokens"),
    )


def from_anthropic(message: Any, *, message_start: Any = None) -> Dict[str, Any]:
    """The usage event of an Anthropic message: ``request_id`` (its
    ``id``), ``model_id``, ``input_tokens`` (Anthropic's ``input_tokens`` +
    ``cache_read_input_tokens`` + ``cache_creation_input_tokens``, which it
    reports apart), ``output_tokens`` and the two cache counts where present.

    For a streamed message pass the final ``message_delta`` event with the
    ``message_start`` event it followed: the start carries the id, model
    and input usage, the delta the cumulative output (and, on newer APIs,
    input) counts, which win. A ``message_start`` event or the SDK's final
    accumulated message works alone. Add ``user_id`` and pass it to
    ``record``."""
    m = _plain(message)
    if not m:
        raise ValueError("overage: no Anthropic message")
    if m.get("type") == "message_start":
        m = _plain(m.get("message")) or {}
    usage: Dict[str, Any] = dict(_plain(m.get("usage")) or {})
    if m.get("type") == "message_delta":
        start = _plain(message_start)
        if not start:
            raise ValueError("overage: a message_delta event needs its message_start (message_start=) for the id, model and input usage")
        if start.get("type") == "message_start":
            start = _plain(start.get("message")) or {}
        merged = dict(_plain(start.get("usage")) or {})
        merged.update({k: v for k, v in usage.items() if v is not None})
        usage, m = merged, start
    if not usage:
        raise ValueError("overage: the Anthropic message has no usage")
    read, write = _int(usage, "cache_read_input_tokens"), _int(usage, "cache_creation_input_tokens")
    ev: Dict[str, Any] = {
        "request_id": m.get("id"),
        "model_id": m.get("model"),
        "input_tokens": _int(usage, "input_tokens") + read + write,
        "output_tokens": _int(usage, "output_tokens"),
    }
    return _put_counts(ev, cache_read_input_tokens=read, cache_creation_input_tokens=write)
