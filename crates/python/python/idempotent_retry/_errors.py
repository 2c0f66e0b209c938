"""The exceptions the transports raise: httpx's own types, with the operation's outcome."""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Any, Callable, Optional, Sequence, Tuple

import httpx

from . import _native

__all__ = [
    "Attempt",
    "history_of",
    "OperationError",
    "ConnectError",
    "ConnectTimeout",
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
    "ErrorTypes",
    "HTTPX",
]


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One attempt of an operation, as the engine recorded it.

    Attributes:
        number: 1 for the first attempt.
        started: when it started, from the start of the first attempt.
        status: the status of its response, or ``None`` when none came (a refused connection,
            a timeout, a reset).
        failure: why it was not final, as the engine names it (``server_error`` for a 5xx,
            ``connect``, ``timeout``, ``connection_reset``, ``throttled``, ...), or
            ``None`` for a final answer.
        wait: how long the operation waited after it, when another attempt followed.
    """

    number: int
    started: datetime.timedelta
    status: Optional[int]
    failure: Optional[str]
    wait: Optional[datetime.timedelta]


#: One attempt as the native answer gives it: number, start, status, failure, wait.
HistoryRow = Tuple[int, float, Optional[int], Optional[str], Optional[float]]


def history_of(rows: Sequence[HistoryRow]) -> Tuple[Attempt, ...]:
    """The ``Attempt`` records of the native answer's history rows."""
    return tuple(
        Attempt(
            number=number,
            started=datetime.timedelta(seconds=started),
            status=status,
            failure=failure,
            wait=None if wait is None else datetime.timedelta(seconds=wait),
        )
        for number, started, status, failure, wait in rows
    )


class OperationError(Exception):
    """What every exception of the transports also is: an operation that ended without a final
    answer, with what is known of it.

    Attributes:
        outcome: ``"unknown"`` when the receiver may have run the operation and no answer says
            whether (look it up by ``key``, or send it again later with the same key);
            ``"not_done"`` when it certainly did not run; ``"done"`` when it has an answer
            (a key reused for another request that succeeded, a body cut off after the head
            arrived, or an answer the ledger did not keep: ``AnswerNotSavedError``).
        key: the operation's idempotency key, or ``None`` if it had none.
        attempts: how many attempts this run sent.
        kind: why it stopped, as the engine names it (``attempts_exhausted``, ``transport``,
            ``reconcile_window``, ``still_in_progress``, ``key_reuse``, ``lease_held``,
            ``ledger``, ``answer_not_saved``, ...).
        failure: how the last attempt failed (``connect``, ``timeout``, ``connection_reset``,
            ``connection_closed``, ...), or ``None``.
        elapsed: a ``datetime.timedelta``, from the start of the first attempt to the end of
            the last, the waits between them included (zero when nothing was sent), plus
            ``lease_wait``.
        history: one ``Attempt`` per attempt sent by this run, in order (empty when nothing
            was sent): each one's status or failure, when it started, the wait after it.
        lease_wait: a ``datetime.timedelta``, how long the operation waited, before anything
            was sent, for another run holding its key in the ledger (zero without a wait; for
            a ``LeaseHeldError``, the whole ``lease_wait=`` it was allowed).
        status: the status the exception names: for ``HTTPStatusError``, its response's
            (the last attempt's); for ``AnswerNotSavedError``, the saved answer's (outcome
            ``"done"``); otherwise ``None``.
    """

    outcome: str
    key: Optional[str]
    attempts: int
    kind: Optional[str]
    failure: Optional[str]
    elapsed: datetime.timedelta
    history: Tuple[Attempt, ...]
    lease_wait: datetime.timedelta
    status: Optional[int]

    def _annotate(
        self,
        outcome: str,
        key: Optional[str],
        attempts: int,
        kind: Optional[str],
        failure: Optional[str],
        elapsed: float = 0.0,
        history: Tuple[Attempt, ...] = (),
        lease_wait: float = 0.0,
        status: Optional[int] = None,
    ) -> None:
        self.outcome = outcome
        self.key = key
        self.attempts = attempts
        self.kind = kind
        self.failure = failure
        self.elapsed = datetime.timedelta(seconds=elapsed)
        self.history = history
        self.lease_wait = datetime.timedelta(seconds=lease_wait)
        self.status = status

    @property
    def is_outcome_unknown(self) -> bool:
        """Whether the operation may have run."""
        return self.outcome == "unknown"


class ConnectError(OperationError, httpx.ConnectError):
    """No connection could be made (or the name did not resolve): ``outcome`` is
    ``"not_done"`` unless an earlier attempt may have run."""


class ConnectTimeout(OperationError, httpx.ConnectTimeout):
    """Connecting timed out."""


class ReadTimeout(OperationError, httpx.ReadTimeout):
    """The last attempt timed out after connecting: the receiver may be running it
    (``outcome`` ``"unknown"``)."""


class ReadError(OperationError, httpx.ReadError):
    """The connection was reset after the request went out (``outcome`` ``"unknown"``)."""


class RemoteProtocolError(OperationError, httpx.RemoteProtocolError):
    """The connection closed before a complete response (``outcome`` ``"unknown"``)."""


class TransportError(OperationError, httpx.TransportError):
    """Any other stop without an answer (the retry budget, the reconcile window, a server's
    ``Retry-After`` too long, a failing body stream, a receiver still "in progress" past
    ``max_in_progress_wait=`` when its last answer could not be read), as for attempts that
    ran out (``kind`` says which)."""


class BodyNotReplayable(OperationError, httpx.TransportError):
    """A retry was due, but the request body was a stream already sent once."""


class KeyReuseError(OperationError, httpx.TransportError):
    """The ledger holds this key for a different request (method, URL or body): nothing was
    sent. ``outcome`` is the held operation's."""


class LeaseHeldError(OperationError, httpx.TransportError):
    """Another run holds this key's lease in the ledger and is sending it, and the transport's
    ``lease_wait=`` (4 minutes by default) ran out first: nothing was sent; try again later
    with the same key, or pass a longer ``lease_wait=``."""


class LedgerError(OperationError, httpx.TransportError):
    """The ledger could not be read or written (``outcome`` says whether it may have run)."""


class AnswerNotSavedError(OperationError, httpx.TransportError):
    """The ledger holds this operation as succeeded, but not its answer's body: it was longer
    than ``max_saved_body=``. Nothing was sent, and no empty body is handed over as the
    answer. ``outcome`` is ``"done"`` (its effect stands; do not send it under a new key) and
    ``status`` the saved answer's status. Raised with ``fetch_unsaved_answers=False``, or past
    the operation's reconcile window; inside the window a transport with
    ``fetch_unsaved_answers=True`` (the default) sends it again with its key and returns the
    receiver's answer instead (``Report.refetched``)."""


class HTTPStatusError(OperationError, httpx.HTTPStatusError):
    """The retries stopped on a response that is not a final answer (the last attempt's 503,
    a 429 whose ``Retry-After`` is too long, a 409 "in progress" past
    ``max_in_progress_wait=``, a spent retry budget, the reconcile window's end): ``outcome``
    is ``"unknown"`` (the receiver may have run it: send it again later with the same
    ``key``) or ``"not_done"``, ``kind`` says why it stopped. ``response`` is that last
    response, its body already read, its ``Report`` at
    ``response.extensions["idempotent_retry"]``; ``status`` its status. Raised for a keyed
    operation unless the transport has ``raise_on_unknown=False`` (which returns the response
    instead), and for a keyless one only with ``raise_on_unknown=True``."""


class InvalidRequest(OperationError, httpx.RequestError):
    """The request or its key was refused before anything was sent (a bad URL, header or
    key): ``outcome`` is ``"not_done"``."""


#: The Rust crate's advice in a lease-held message, which names its own option
#: (``LedgerOptions::on_lease_held``); a Python caller is told about ``lease_wait=`` instead.
_RUST_WAIT_HINT = re.compile(
    r" \(LedgerOptions::on_lease_held\), wait longer with a larger max_wait"
    r"|; LedgerOptions::on_lease_held\(LeaseHeldPolicy::WAIT\) waits for it"
)

#: What a ``LeaseHeldError``'s message ends with: after a wait, and without one
#: (``lease_wait=0``).
_LEASE_WAIT_HINT = "; pass lease_wait=SECONDS to the transport to wait longer for it"
_LEASE_NO_WAIT_HINT = "; pass lease_wait=SECONDS to the transport to wait for it"

#: The Rust crate's names for the options a message advises, and the transport's keywords.
_RUST_OPTIONS = (
    (
        "send it with LedgerOptions::fetch_unsaved_answers(true) to have the receiver answer "
        "it again under the key",
        "send it through a transport with fetch_unsaved_answers=True (the default) to have "
        "the receiver answer it again under the key",
    ),
    ("LedgerOptions::max_body", "max_saved_body="),
    ("RetryBudgetConfig::with_capacity", "budget_capacity="),
    ("RetryPolicy::with_max_in_progress_wait", "max_in_progress_wait=SECONDS"),
    ("(max_in_progress_wait is 0)", "(max_in_progress_wait=0)"),
)


def python_message(message: str) -> str:
    """The engine's message with the Rust crate's option names turned into the transport's
    keywords."""
    for rust, python in _RUST_OPTIONS:
        message = message.replace(rust, python)
    return message


#: One exception class of an httpx flavour, as ``ErrorTypes`` calls it: ``cls(message,
#: request=request)``, which ``type[OperationError]`` cannot say (``Exception`` takes no
#: ``request``; the httpx half of each class does).
ErrorClass = Callable[..., OperationError]


class ErrorTypes:
    """The exception classes of one httpx flavour (httpx, httpx2), by what they report."""

    def __init__(
        self,
        *,
        connect: ErrorClass,
        timeout: ErrorClass,
        reset: ErrorClass,
        closed: ErrorClass,
        other: ErrorClass,
        body_not_replayable: ErrorClass,
        key_reuse: ErrorClass,
        lease_held: ErrorClass,
        ledger: ErrorClass,
        answer_not_saved: ErrorClass,
        invalid: ErrorClass,
        status: ErrorClass,
    ) -> None:
        self.by_failure = {
            "dns": connect,
            "connect": connect,
            "redirect_target_unreachable": connect,
            "timeout": timeout,
            "connection_reset": reset,
            "connection_closed": closed,
        }
        self.by_kind = {
            "body_not_replayable": body_not_replayable,
            "key_reuse": key_reuse,
            "lease_held": lease_held,
            "ledger": ledger,
            "answer_not_saved": answer_not_saved,
            # As for attempts that ran out: a response when the last one could be read (the
            # 409, ``Report.stopped``), else this.
            "still_in_progress": other,
            "builder": invalid,
            "invalid_key": invalid,
        }
        self.other = other
        self.invalid = invalid
        self.status_class = status

    def error_for(self, answer: _native.Answer, request: Any) -> OperationError:
        """The exception for an answer without a response."""
        kind = answer.error_kind
        by_kind = None if kind is None else self.by_kind.get(kind)
        by_failure = None if answer.failure is None else self.by_failure.get(answer.failure)
        cls = by_kind or by_failure or self.other
        message = python_message(answer.message or "the operation stopped without an answer")
        if kind == "lease_held":
            message = _RUST_WAIT_HINT.sub("", message)
        key = answer.key
        # The engine's message names the outcome and the key of an operation that may have
        # run; say them for every other stop too.
        if key is not None and key not in message:
            message = f"{message} [outcome {answer.outcome}, key {key}]"
        elif "outcome" not in message:
            message = f"{message} [outcome {answer.outcome}]"
        if kind == "lease_held":
            message += _LEASE_WAIT_HINT if answer.lease_wait > 0 else _LEASE_NO_WAIT_HINT
        error = cls(message, request=request)
        error._annotate(
            answer.outcome,
            key,
            answer.attempts,
            kind,
            answer.failure,
            answer.elapsed,
            history_of(answer.history),
            answer.lease_wait,
            answer.error_status,
        )
        return error

    def status_error(self, answer: _native.Answer, response: Any) -> OperationError:
        """The exception for an operation whose retries stopped on ``response`` (the last
        attempt's, its body read): httpx's ``HTTPStatusError`` with the outcome."""
        status = response.status_code
        kind = answer.error_kind
        label = "Client error" if status < 500 else "Server error"
        message = f"{label} '{status} {response.reason_phrase}' for url '{response.request.url}': "
        message += python_message(answer.message or f"the retries stopped on it ({kind})")
        key = answer.key
        if key is not None and key not in message:
            message = f"{message} [outcome {answer.outcome}, key {key}]"
        elif "outcome" not in message:
            message = f"{message} [outcome {answer.outcome}]"
        error = self.status_class(message, request=response.request, response=response)
        error._annotate(
            answer.outcome,
            key,
            answer.attempts,
            kind,
            answer.failure,
            answer.elapsed,
            history_of(answer.history),
            answer.lease_wait,
            status,
        )
        return error

    def refused(self, error: ValueError, request: Any) -> OperationError:
        """The exception for a request the engine refused to read (a bad method, header or
        key)."""
        refusal = self.invalid(str(error), request=request)
        refusal._annotate("not_done", None, 0, "invalid_request", None)
        return refusal


#: httpx's flavour.
HTTPX = ErrorTypes(
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
