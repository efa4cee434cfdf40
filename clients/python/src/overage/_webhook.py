"""Verification of overage's alert webhooks."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any, Dict, List, Optional, Union

from ._errors import WebhookVerificationError

__all__ = ["verify_webhook", "sign_webhook"]

#: How old a signature may be, in seconds, by default.
DEFAULT_TOLERANCE = 300


def _bytes(body: Union[bytes, bytearray, str]) -> bytes:
    if isinstance(body, str):
        return body.encode("utf-8")
    return bytes(body)


def sign_webhook(body: Union[bytes, str], secret: str, timestamp: Optional[int] = None) -> str:
    """The ``Overage-Signature`` header overage sends with body: for tests of
    a receiver."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    mac = hmac.new(secret.encode("utf-8"), b"%d." % t + _bytes(body), hashlib.sha256).hexdigest()
    return "t=%d,v1=%s" % (t, mac)


def verify_webhook(
    body: Union[bytes, bytearray, str],
    header: Optional[str],
    secret: str,
    *,
    tolerance: int = DEFAULT_TOLERANCE,
    now: Optional[float] = None,
) -> Dict[str, Any]:
    """Checks an alert webhook and returns its event.

    ``body`` is the request body exactly as received (bytes; verify before
    parsing), ``header`` the ``Overage-Signature`` header,
    ``t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`` keyed with the
    endpoint's whole signing secret (``whsec_...``). Several ``v1`` entries
    may be given (during a secret's rotation); one matching is enough. A
    timestamp more than ``tolerance`` seconds from now is refused, so a
    captured delivery cannot be replayed later. Raises
    WebhookVerificationError. Deduplicate deliveries on the event's ``id``.
    """
    if not secret:
        raise WebhookVerificationError("overage: no webhook signing secret given")
    if not header:
        raise WebhookVerificationError("overage: no Overage-Signature header")
    t: Optional[int] = None
    sigs: List[str] = []
    for part in header.split(","):
        k, sep, v = part.strip().partition("=")
        if not sep:
            continue
        if k == "t":
            try:
                t = int(v)
            except ValueError:
                raise WebhookVerificationError("overage: Overage-Signature has a malformed timestamp %r" % v) from None
        elif k == "v1":
            sigs.append(v)
    if t is None or not sigs:
        raise WebhookVerificationError("overage: Overage-Signature must be t=<unix seconds>,v1=<hex signature>")
    current = time.time() if now is None else now
    if abs(current - t) > tolerance:
        raise WebhookVerificationError("overage: the signature's timestamp is %ds from now, over the tolerance of %ds" % (int(current - t), tolerance))
    raw = _bytes(body)
    expected = hmac.new(secret.encode("utf-8"), b"%d." % t + raw, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(expected, s) for s in sigs):
        raise WebhookVerificationError("overage: no Overage-Signature v1 matches the body and secret")
    try:
        event = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise WebhookVerificationError("overage: the signed body is not JSON: %s" % e) from None
    if not isinstance(event, dict):
        raise WebhookVerificationError("overage: the signed body is not a JSON object")
    return event
