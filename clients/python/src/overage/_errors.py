"""The errors of the overage client."""

from dataclasses import dataclass
from typing import List, Optional

PROBLEM_BASE = "https://overage.dev/problems/"
PROBLEM_KEY_REUSED = PROBLEM_BASE + "idempotency-key-reused"
PROBLEM_IN_PROGRESS = PROBLEM_BASE + "idempotency-key-in-progress"
PROBLEM_STREAM_CLOSED = PROBLEM_BASE + "stream-closed"


@dataclass(frozen=True)
class FieldError:
    """One bad input the server named, e.g. ``events[1].input_tokens``."""

    field: str
    detail: str


class OverageError(Exception):
    """A request the client gave up on.

    Either the server refused it (``status`` and the RFC 9457 problem
    ``type``, ``title``, ``detail`` and ``fields``) and a retry would not
    help, or the attempts or the deadline ran out, in which case it is the
    last attempt's error. ``attempts`` is how many requests were sent; ``key``
    the Idempotency-Key they carried (resend under the same key to stay
    exactly once).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        type: str = "",
        title: str = "",
        detail: str = "",
        fields: Optional[List[FieldError]] = None,
        attempts: int = 0,
        key: Optional[str] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.fields: List[FieldError] = list(fields or [])
        self.attempts = attempts
        self.key = key
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        """Whether the same request, under the same key, may succeed later."""
        if self.status == 0:
            return True
        if self.status == 409:
            return self.type == PROBLEM_IN_PROGRESS
        return self.status == 429 or self.status >= 500

    def __str__(self) -> str:
        base = super().__str__()
        if self.attempts:
            return "%s (after %d attempt%s)" % (base, self.attempts, "" if self.attempts == 1 else "s")
        return base


class TransportError(OverageError):
    """No answer: the connection failed, was closed or timed out. The request
    may or may not have been executed; resending it under the same key is
    safe."""


class DeadlineExceeded(OverageError):
    """The operation's deadline passed before an attempt succeeded; the
    attributes are those of the last attempt's error."""


class WebhookVerificationError(Exception):
    """An alert webhook whose signature is missing, malformed, wrong or too
    old."""
