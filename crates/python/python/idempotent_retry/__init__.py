"""httpx transports over the idempotent-retry engine: one idempotency key per logical
operation, retries only of what is safe to retry, the three-way outcome (done, not done,
unknown) and an optional durable ledger shared with Rust processes.

    import httpx
    from idempotent_retry import Transport

    client = httpx.Client(transport=Transport(max_attempts=4))
    response = client.post("https://api.example.com/v1/charges", json={"amount": 500})
    print(response.extensions["idempotent_retry"].attempts)

``idempotent_retry.httpx2`` has the same transports for httpx2.
"""

from ._errors import (
    AnswerNotSavedError,
    Attempt,
    BodyNotReplayable,
    ConnectError,
    ConnectTimeout,
    HTTPStatusError,
    InvalidRequest,
    KeyReuseError,
    LeaseHeldError,
    LedgerError,
    OperationError,
    ReadError,
    ReadTimeout,
    RemoteProtocolError,
    TransportError,
)
from ._transport import (
    REPORT_EXTENSION,
    AsyncTransport,
    Report,
    Transport,
    current_idempotency_key,
    derive,
    for_tool_call,
    idempotency_key,
)

__all__ = [
    "AnswerNotSavedError",
    "AsyncTransport",
    "Attempt",
    "BodyNotReplayable",
    "ConnectError",
    "ConnectTimeout",
    "HTTPStatusError",
    "InvalidRequest",
    "KeyReuseError",
    "LeaseHeldError",
    "LedgerError",
    "OperationError",
    "REPORT_EXTENSION",
    "ReadError",
    "ReadTimeout",
    "RemoteProtocolError",
    "Report",
    "Transport",
    "TransportError",
    "current_idempotency_key",
    "derive",
    "for_tool_call",
    "idempotency_key",
]
