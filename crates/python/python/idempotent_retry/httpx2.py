"""The transports for httpx2 (the successor of httpx that openai-python 3 runs on): the same
engine, options, keys and reports as ``idempotent_retry.Transport`` and ``AsyncTransport``,
raising httpx2's exception types. Importing this module needs httpx2 installed.

    import httpx2
    from idempotent_retry.httpx2 import Transport

    client = httpx2.Client(transport=Transport(max_attempts=4))
"""

from __future__ import annotations

import httpx2

from ._errors import ErrorTypes, OperationError
from ._transport import _OPTIONS_DOC, AsyncEngineTransport, SyncEngineTransport

__all__ = [
    "Transport",
    "AsyncTransport",
    "ConnectError",
    "ReadTimeout",
    "ReadError",
    "RemoteProtocolError",
    "TransportError",
    "BodyNotReplayable",
    "KeyReuseError",
    "LeaseHeldError",
    "LedgerError",
    "AnswerNotSavedError",
    "InvalidRequest",
    "HTTPStatusError",
]


class ConnectError(OperationError, httpx2.ConnectError):
    """No connection could be made (``idempotent_retry.ConnectError``, for httpx2)."""


class ReadTimeout(OperationError, httpx2.ReadTimeout):
    """The last attempt timed out after connecting (``outcome`` ``"unknown"``)."""


class ReadError(OperationError, httpx2.ReadError):
    """The connection was reset after the request went out (``outcome`` ``"unknown"``)."""


class RemoteProtocolError(OperationError, httpx2.RemoteProtocolError):
    """The connection closed before a complete response (``outcome`` ``"unknown"``)."""


class TransportError(OperationError, httpx2.TransportError):
    """Any other stop without an answer."""


class BodyNotReplayable(OperationError, httpx2.TransportError):
    """A retry was due, but the request body was a stream already sent once."""


class KeyReuseError(OperationError, httpx2.TransportError):
    """The ledger holds this key for a different request: nothing was sent."""


class LeaseHeldError(OperationError, httpx2.TransportError):
    """Another run holds this key's lease in the ledger, and ``lease_wait=`` ran out first:
    nothing was sent."""


class LedgerError(OperationError, httpx2.TransportError):
    """The ledger could not be read or written."""


class AnswerNotSavedError(OperationError, httpx2.TransportError):
    """The ledger holds this operation as succeeded, but not its answer's body (longer than
    ``max_saved_body=``): nothing was sent; ``outcome`` ``"done"``, ``status`` the saved
    answer's (``idempotent_retry.AnswerNotSavedError``, for httpx2)."""


class InvalidRequest(OperationError, httpx2.RequestError):
    """The request or its key was refused before anything was sent."""


class HTTPStatusError(OperationError, httpx2.HTTPStatusError):
    """The retries stopped on a response that is not a final answer (``response``, read):
    ``idempotent_retry.HTTPStatusError``, for httpx2."""


_ERRORS = ErrorTypes(
    connect=ConnectError,
    timeout=ReadTimeout,
    reset=ReadError,
    closed=RemoteProtocolError,
    other=TransportError,
    body_not_replayable=BodyNotReplayable,
    key_reuse=KeyReuseError,
    lease_held=LeaseHeldError,
    ledger=LedgerError,
    answer_not_saved=AnswerNotSavedError,
    invalid=InvalidRequest,
    status=HTTPStatusError,
)


class Transport(SyncEngineTransport, httpx2.BaseTransport):
    """``idempotent_retry.Transport`` for httpx2: the same engine, raising httpx2's types."""

    __doc__ = (__doc__ or "") + _OPTIONS_DOC
    _hx = httpx2
    _errors = _ERRORS


class AsyncTransport(AsyncEngineTransport, httpx2.AsyncBaseTransport):
    """``idempotent_retry.AsyncTransport`` for httpx2."""

    __doc__ = (__doc__ or "") + _OPTIONS_DOC
    _hx = httpx2
    _errors = _ERRORS
