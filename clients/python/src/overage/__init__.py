"""Client for the overage usage-billing API: report LLM token usage exactly
once.

    from overage import Client
    c = Client("http://127.0.0.1:8080", api_key)
    r = c.record(request_id="chatcmpl-1", user_id="u_42", model_id="gpt-4o",
                 input_tokens=1200, output_tokens=350)
    r.log["id"], r.replayed, r.duplicate
"""

from ._client import (
    MAX_BATCH_EVENTS,
    BatchResult,
    CheckpointResult,
    Client,
    CorrectionResult,
    MeterUsage,
    RecordResult,
    Stream,
    Usage,
)
from ._convert import from_anthropic, from_openai
from ._errors import (
    PROBLEM_IN_PROGRESS,
    PROBLEM_KEY_REUSED,
    PROBLEM_STREAM_CLOSED,
    DeadlineExceeded,
    FieldError,
    OverageError,
    TransportError,
    WebhookVerificationError,
)
from ._webhook import sign_webhook, verify_webhook

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Stream",
    "RecordResult",
    "BatchResult",
    "CheckpointResult",
    "CorrectionResult",
    "Usage",
    "MeterUsage",
    "MAX_BATCH_EVENTS",
    "OverageError",
    "TransportError",
    "DeadlineExceeded",
    "FieldError",
    "WebhookVerificationError",
    "PROBLEM_KEY_REUSED",
    "PROBLEM_IN_PROGRESS",
    "PROBLEM_STREAM_CLOSED",
    "from_openai",
    "from_anthropic",
    "verify_webhook",
    "sign_webhook",
]
