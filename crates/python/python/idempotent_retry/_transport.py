"""httpx transports over the engine: ``Transport`` (sync) and ``AsyncTransport`` (asyncio)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime
import json
import os
import ssl
import threading
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import httpx

from . import _native
from ._errors import HTTPX, Attempt, ErrorTypes, history_of, python_message

__all__ = [
    "Transport",
    "AsyncTransport",
    "Report",
    "derive",
    "for_tool_call",
    "idempotency_key",
    "current_idempotency_key",
    "REPORT_EXTENSION",
]

#: The key of the ``Report`` in ``response.extensions``.
REPORT_EXTENSION = "idempotent_retry"

_KEY: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar(
    "idempotent_retry_key", default=None
)


def derive(scope: str, parts: Sequence[str] = ()) -> str:
    """A key derived from a scope and parts that survive a restart: the same 64 hex digits as
    the Rust crate's ``IdempotencyKey::derive(scope, parts)``."""
    return _native.derive(scope, list(parts))


def for_tool_call(tool: str, args: Any) -> str:
    """A key for one tool call: the same as the Rust crate's
    ``IdempotencyKey::for_tool_call(tool, args)``, over the RFC 8785 canonical JSON of
    ``args`` (anything ``json.dumps`` accepts; NaN and infinities are refused with
    ``ValueError``)."""
    return _native.for_tool_call(tool, json.dumps(args, allow_nan=False))


@contextlib.contextmanager
def idempotency_key(key: str) -> Iterator[str]:
    """Within the block, every request sent through a ``Transport`` or ``AsyncTransport`` in
    this context (thread or asyncio task) is sent under ``key``, even one that carries its own
    key header: for calls made through a library whose requests you cannot touch (an SDK that
    mints a random key per call). Use one key per logical operation: two different requests
    under one key are refused by a ledger (``KeyReuseError``) and by a Stripe-style receiver."""
    token = _KEY.set(key)
    try:
        yield key
    finally:
        _KEY.reset(token)


def current_idempotency_key() -> Optional[str]:
    """The key set by the innermost ``idempotency_key`` block, or ``None``."""
    return _KEY.get()


@dataclasses.dataclass(frozen=True)
class Report:
    """What the engine did for one response, at ``response.extensions["idempotent_retry"]``.

    Attributes:
        attempts: attempts sent by this run (0 for a response replayed from the ledger).
        key: the operation's idempotency key, or ``None``.
        replayed: whether the response is the ledger's saved answer, nothing sent.
        elapsed: a ``datetime.timedelta``, from the first attempt to the end of the last,
            ``lease_wait`` included: the same type as the exceptions' ``elapsed``.
        outcome: ``"done"`` for a final answer; ``"unknown"`` or ``"not_done"`` when the
            retries stopped on this response (a 503 after the last attempt, a 429 asking for
            too long a wait): it is the last attempt's answer, not the operation's. Such a
            response is raised as ``HTTPStatusError`` (this report in its response's
            extensions) unless ``raise_on_unknown=False``, or the request is keyless.
        stopped: why the retries stopped on this response (``attempts_exhausted``,
            ``retry_after_too_long``, ``reconcile_window``, ``budget_exhausted``,
            ``still_in_progress``: the receiver still answered 409 "in progress" when
            ``max_in_progress_wait=`` ran out, outcome ``"unknown"``), or ``None`` for a final
            answer.
        message: the engine's explanation when ``stopped`` is set.
        history: one ``Attempt`` per attempt sent by this run, in order (empty for a replayed
            response): each one's status or failure, when it started, the wait after it.
        lease_wait: a ``datetime.timedelta``, waited before anything was sent for another run
            holding the key in the ledger (its answer replayed, or its lapsed lease taken
            over); zero without a wait.
        unrecorded: why the response was not recorded in the ledger as this run's outcome,
            when it was not (another run took the key over while the answer arrived); the
            response is still the operation's answer. ``None`` when it was recorded, or
            without a ledger.
        in_progress_waits: answers that said the operation was still in progress at the
            receiver (a keyed 409: often this operation's own earlier attempt, still running
            there), each waited out. Counted in ``attempts``, not toward ``max_attempts``.
        in_progress_wait: a ``datetime.timedelta``, spent waiting those out (counted in
            ``elapsed``); at most ``max_in_progress_wait=``.
        refetched: whether the ledger held this operation as succeeded without its answer's
            body (longer than ``max_saved_body=``), so it was sent again with its key and this
            is the receiver's answer from its own store (``fetch_unsaved_answers=``); the
            receiver still holds the key inside the reconcile window, so no second effect.
        answered_url: the URL that gave the answer when it is not the request's: for a
            replayed answer, the last hop of the redirects its first run followed (the
            ledger keeps it with the answer). ``None`` when the request's URL answered.
    """

    attempts: int
    key: Optional[str]
    replayed: bool
    elapsed: datetime.timedelta
    outcome: str
    stopped: Optional[str]
    message: Optional[str]
    history: Tuple[Attempt, ...] = ()
    lease_wait: datetime.timedelta = datetime.timedelta(0)
    unrecorded: Optional[str] = None
    in_progress_waits: int = 0
    in_progress_wait: datetime.timedelta = datetime.timedelta(0)
    refetched: bool = False
    answered_url: Optional[str] = None


def _timeout(request: Any) -> Optional[float]:
    """httpx's timeout on the request as one attempt timeout: the longest of its connect,
    read, write and pool limits, or ``None`` (the policy's) when none is set."""
    timeouts = request.extensions.get("timeout") or {}
    values = [value for value in timeouts.values() if value is not None]
    return max(values) if values else None


def _buffered(hx: Any, request: Any) -> Tuple[bool, Optional[bytes]]:
    """``(True, bytes)`` for a body held in memory (sent again on every attempt), ``(False,
    None)`` for a stream that can be read once only."""
    try:
        content = request.content
    except hx.RequestNotRead:
        multipart = getattr(getattr(hx, "_multipart", None), "MultipartStream", None)
        if isinstance(request.stream, hx.ByteStream) or (
            multipart is not None and isinstance(request.stream, multipart)
        ):
            # Bytes in memory (the body httpx passes on to the request of a 307 or 308 it
            # follows), or a form of in-memory fields and files: read again at will.
            content = b"".join(request.stream)
        else:
            return False, None
    return True, (content or None)


def _headers(request: Any) -> List[Tuple[bytes, bytes]]:
    return list(request.headers.raw)


def _key() -> Optional[str]:
    return _KEY.get()


#: Where a request answered with a redirect keeps its operation, for the redirect httpx
#: builds from it: httpx copies a request's ``extensions`` into that request (and into
#: ``response.next_request`` when it does not follow).
_REDIRECTED = "idempotent_retry.redirected"
#: The redirects httpx follows, and so does the engine's rule (``RedirectPolicy``).
_REDIRECTS = frozenset((301, 302, 303, 307, 308))


@dataclasses.dataclass(frozen=True)
class _Redirected:
    """An operation answered with a redirect: the request as first sent (its method, URL,
    bytes and the key it went with, ``None`` for a request sent without one), the stream httpx
    passes on to a hop that resends it, and the redirects answered so far, as ``(status,
    location)``; the last location is where the hop goes."""

    method: str
    url: str
    body: Optional[bytes]
    stream: Any
    key: Optional[str]
    after: Tuple[Tuple[int, str], ...]


@dataclasses.dataclass(frozen=True)
class _Outgoing:
    """What the engine is given for one request: ``after`` set when it continues the
    operation of an earlier request, ``redirected`` that operation."""

    method: str
    url: str
    headers: List[Tuple[bytes, bytes]]
    body: Any
    key: Optional[str]
    keyless: bool = False
    after: Optional[List[Tuple[int, str]]] = None
    redirected: Optional[_Redirected] = None


def _target(url: Any) -> str:
    """A URL as the request target it names: without its fragment, which is never sent."""
    return str(url.copy_with(fragment=None))


def _without_key(headers: List[Tuple[bytes, bytes]], key_header: str) -> List[Tuple[bytes, bytes]]:
    name = key_header.encode("ascii")
    return [(field, value) for field, value in headers if field.lower() != name]


def _outgoing(engine: Any, hx: Any, request: Any) -> Tuple[_Outgoing, bool]:
    """The engine's arguments for ``request``, and whether its body is held in memory.

    A request that httpx built to follow a redirect this transport answered (it carries the
    operation in its extensions, and goes where that redirect points) is part of that
    operation: a hop that resends it (httpx keeps the method and the body: 307, 308, and 301
    on a method other than ``POST``) continues the operation under its key, with the bytes
    read for the first request, when the key may go to the hop's origin (the same origin, or
    ``allow_key_to=``); the engine records it under the request as first sent. Any other hop
    is a request of its own, without the key: a ``GET`` for the result (303; 301 and 302 on a
    ``POST``) or a resend to an origin the key may not go to."""
    redirected = request.extensions.get(_REDIRECTED)
    headers = _headers(request)
    if isinstance(redirected, _Redirected) and _target(request.url) == redirected.after[-1][1]:
        resend = request.method == redirected.method and request.stream is redirected.stream
        if (
            resend
            and redirected.key is not None
            and engine.redirect_keeps_key(redirected.url, redirected.after[-1][1])
        ):
            outgoing = _Outgoing(
                redirected.method,
                redirected.url,
                headers,
                redirected.body,
                redirected.key,
                after=list(redirected.after),
                redirected=redirected,
            )
            return outgoing, True
        if resend:
            body: Optional[bytes] = redirected.body
        else:
            _, body = _buffered(hx, request)
        outgoing = _Outgoing(
            request.method,
            str(request.url),
            _without_key(headers, engine.key_header),
            body,
            None,
            keyless=True,
        )
        return outgoing, True
    buffered, body = _buffered(hx, request)
    return _Outgoing(request.method, str(request.url), headers, body, _key()), buffered


def _mark(hx: Any, request: Any, outgoing: _Outgoing, answer: Any) -> None:
    """Keeps the operation in ``request.extensions`` when its answer is a redirect, for the
    request httpx builds to follow it."""
    if answer.status not in _REDIRECTS:
        return
    locations = [value for name, value in answer.headers if name.lower() == b"location"]
    if len(locations) != 1:
        return  # httpx follows none without one; the engine none with several
    try:
        location = _target(request.url.join(locations[0].decode("latin-1")))
    except (hx.InvalidURL, ValueError):
        return  # httpx raises its own error for it
    hop = ((answer.status, location),)
    redirected = outgoing.redirected
    if redirected is not None:
        marked = dataclasses.replace(redirected, after=redirected.after + hop)
    else:
        marked = _Redirected(
            outgoing.method,
            outgoing.url,
            outgoing.body,
            request.stream,
            None if outgoing.keyless else answer.key,
            hop,
        )
    request.extensions[_REDIRECTED] = marked


_STREAMS: Dict[int, Tuple[type, type]] = {}


def _cut_off(failure: Any, report: Report) -> None:
    """Annotates the error of a streamed body cut off after its head arrived: the operation
    is done, and its report is the response's."""
    failure._annotate(
        "done",
        report.key,
        report.attempts,
        "body",
        "connection_reset",
        report.elapsed.total_seconds(),
        report.history,
        report.lease_wait.total_seconds(),
    )


def _streams(hx: Any, errors: ErrorTypes) -> Tuple[type, type]:
    """The sync and async byte streams of ``hx`` over the rest of a streamed body.

    ``hx`` is the flavour's module (httpx or httpx2), only known at run time: its base
    classes are ``Any`` to mypy, hence the ``misc`` ignores (subclassing ``Any``)."""
    found = _STREAMS.get(id(hx))
    if found is not None:
        return found
    cut = errors.by_failure["connection_reset"]

    class SyncBody(hx.SyncByteStream):  # type: ignore[misc]
        def __init__(self, first: bytes, rest: Any, request: Any, report: Report) -> None:
            self._first, self._rest, self._request = first, rest, request
            self._report = report

        def __iter__(self) -> Iterator[bytes]:
            if self._first:
                yield self._first
            while True:
                try:
                    chunk = self._rest.read_chunk()
                except OSError as error:
                    failure = cut(str(error), request=self._request)
                    _cut_off(failure, self._report)
                    raise failure from None
                if chunk is None:
                    return
                yield chunk

        def close(self) -> None:
            self._rest.close()

    class AsyncBody(hx.AsyncByteStream):  # type: ignore[misc]
        def __init__(self, first: bytes, rest: Any, request: Any, report: Report) -> None:
            self._first, self._rest, self._request = first, rest, request
            self._report = report

        async def __aiter__(self) -> AsyncIterator[bytes]:
            if self._first:
                yield self._first
            loop = asyncio.get_running_loop()
            while True:
                future: asyncio.Future[Tuple[Any, Any]] = loop.create_future()

                def done(
                    chunk: Any, error: Any, future: asyncio.Future[Tuple[Any, Any]] = future
                ) -> None:
                    try:
                        loop.call_soon_threadsafe(_settle, future, (chunk, error))
                    except RuntimeError:
                        pass  # the loop is closed

                self._rest.start_read(done)
                chunk, error = await future
                if error is not None:
                    failure = cut(error, request=self._request)
                    _cut_off(failure, self._report)
                    raise failure
                if chunk is None:
                    return
                yield chunk

        async def aclose(self) -> None:
            self._rest.close()

    _STREAMS[id(hx)] = (SyncBody, AsyncBody)
    return SyncBody, AsyncBody


def _report(answer: Any, request: Any = None) -> Report:
    asked = None if request is None else str(request.url)
    return Report(
        attempts=answer.attempts,
        key=answer.key,
        replayed=answer.replayed,
        elapsed=datetime.timedelta(seconds=answer.elapsed),
        outcome=answer.outcome,
        stopped=answer.error_kind,
        message=None if answer.message is None else python_message(answer.message),
        history=history_of(answer.history),
        lease_wait=datetime.timedelta(seconds=answer.lease_wait),
        unrecorded=answer.unrecorded,
        in_progress_waits=answer.in_progress_waits,
        in_progress_wait=datetime.timedelta(seconds=answer.in_progress_wait),
        refetched=answer.refetched,
        answered_url=answer.url if answer.url not in (None, asked) else None,
    )


def _response(
    hx: Any,
    answer: Any,
    request: Any,
    errors: ErrorTypes,
    sync: bool,
    body: Optional[bytes] = None,
) -> Any:
    """The httpx response of an answer: its body streamed on from the engine, or ``body``
    when it was read already."""
    report = _report(answer, request)
    extensions = {REPORT_EXTENSION: report}
    if answer.http_version:
        extensions["http_version"] = answer.http_version.encode("ascii")
    if body is not None or answer.rest is None:
        stream = hx.ByteStream(body if body is not None else (answer.body or b""))
    else:
        sync_body, async_body = _streams(hx, errors)
        stream = (sync_body if sync else async_body)(
            answer.body or b"", answer.rest, request, report
        )
    return hx.Response(
        answer.status,
        headers=answer.headers,
        stream=stream,
        request=request,
        extensions=extensions,
    )


def _raises(raise_on_unknown: Optional[bool], answer: Any) -> bool:
    """Whether an answer whose retries stopped on a response is raised: ``raise_on_unknown=``
    when it is set, else for a keyed operation only (a keyless request keeps httpx's habit of
    returning the response)."""
    if answer.status is None or answer.error_kind is None:
        return False
    if raise_on_unknown is None:
        return answer.key is not None
    return raise_on_unknown


def _drain(answer: Any) -> bytes:
    """The whole body of the last response of an operation whose retries stopped on it, read
    before it is raised (a connection cut in it ends it where it was cut)."""
    parts = [answer.body or b""]
    rest = answer.rest
    if rest is not None:
        try:
            while True:
                chunk = rest.read_chunk()
                if chunk is None:
                    break
                parts.append(chunk)
        except OSError:
            pass
        finally:
            rest.close()
    return b"".join(parts)


def _status_error(hx: Any, errors: ErrorTypes, answer: Any, request: Any, body: bytes) -> Any:
    """httpx's ``HTTPStatusError`` with the outcome, over the last response: read, its
    ``elapsed`` the operation's, its ``Report`` in its extensions."""
    response = _response(hx, answer, request, errors, sync=True, body=body)
    response.read()
    response.elapsed = datetime.timedelta(seconds=answer.elapsed)
    return errors.status_error(answer, response)


def _finish(hx: Any, errors: ErrorTypes, answer: Any, request: Any, sync: bool) -> Any:
    if answer.status is None:
        raise errors.error_for(answer, request)
    return _response(hx, answer, request, errors, sync)


def _raise_on_unknown(value: object) -> Optional[bool]:
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(
        f"raise_on_unknown: {type(value).__name__} is not a setting; pass None (the default: "
        "raise for a keyed operation, return the response of a keyless one), True (raise for "
        "every request) or False (return the last response, as before 0.2)"
    )


#: What ``verify=`` takes: a bool, or the path of a PEM file of CA certificates.
Verify = Union[bool, str, "os.PathLike[str]"]
#: What ``cert=`` takes: one PEM file with the certificate and its key, or a (certificate,
#: key) pair of files.
Cert = Union[
    str,
    "os.PathLike[str]",
    Tuple[Union[str, "os.PathLike[str]"], Union[str, "os.PathLike[str]", None]],
]


def _tls(verify: object, cert: object) -> Dict[str, Any]:
    """The engine's TLS arguments for the transports' ``verify=`` and ``cert=``."""
    if isinstance(verify, ssl.SSLContext):
        raise TypeError(
            "verify: an ssl.SSLContext cannot be used by this transport (its trust store "
            "cannot be read back from it); pass verify=True (the platform's roots), "
            "verify=False (no verification), or verify=\"/path/to/ca.pem\" (a PEM file of the "
            "CA certificates to trust), and cert= for a client certificate"
        )
    if isinstance(verify, bool):
        tls: Dict[str, Any] = {"verify": verify, "ca_file": None}
    elif isinstance(verify, (str, os.PathLike)):
        tls = {"verify": True, "ca_file": os.fspath(verify)}
    else:
        raise TypeError(
            f"verify: {type(verify).__name__} is not a verify setting; pass True, False, or "
            "the path of a PEM file of CA certificates"
        )
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    if cert is None:
        pass
    elif isinstance(cert, (str, os.PathLike)):
        cert_file = os.fspath(cert)
    elif isinstance(cert, tuple) and len(cert) in (2, 3):
        if len(cert) == 3 and cert[2] is not None:
            raise ValueError(
                "cert: an encrypted private key is not supported; decrypt it first "
                "(openssl pkey -in key.pem -out plain-key.pem) and pass (certificate, key)"
            )
        cert_file = os.fspath(cert[0])
        key_file = None if cert[1] is None else os.fspath(cert[1])
    else:
        raise TypeError(
            "cert: pass the path of a PEM file with the client certificate and its key, or a "
            "(certificate, key) pair of paths"
        )
    tls.update(cert_file=cert_file, key_file=key_file)
    return tls


def _proxy(proxy: object) -> Optional[str]:
    """The engine's proxy URL for the transports' ``proxy=``."""
    if proxy is None or isinstance(proxy, str):
        return proxy
    raise TypeError(
        f"proxy: {type(proxy).__name__} is not a proxy URL; pass a str such as "
        '"http://user:password@proxy.example:3128"'
    )


def _origins(origins: object) -> List[str]:
    """The engine's ``allow_key_to`` for the transports' ``allow_key_to=``."""
    if not isinstance(origins, (list, tuple, frozenset, set)):
        raise TypeError(
            f"allow_key_to: {type(origins).__name__} is not a list of origins; pass a list "
            'such as ["https://api-eu.example.com"]'
        )
    for origin in origins:
        if not isinstance(origin, str):
            raise TypeError(
                f"allow_key_to: {origin!r} is not an origin; pass str such as "
                '"https://api-eu.example.com"'
            )
    return list(origins)


def _strings(option: str, values: object) -> List[str]:
    """The engine's list for an option that takes a list of str (``seal_keys=``,
    ``keep_query_params=``)."""
    if isinstance(values, (str, bytes)) or not isinstance(
        values, (list, tuple, frozenset, set)
    ):
        raise TypeError(
            f"{option}: {type(values).__name__} is not a list of str; pass a list such as "
            '["k1:..."]'
        )
    for value in values:
        if not isinstance(value, str):
            raise TypeError(f"{option}: an entry of type {type(value).__name__} is not a str")
    return list(values)


_OPTIONS_DOC = """
    Every option is keyword-only; ``ValueError`` for an invalid one (a zero ``max_attempts``,
    a ``base_delay`` above ``max_delay``, a negative duration, a bad header name, a TLS file
    without a usable PEM certificate, a proxy that is not an http(s) URL, a negative
    ``answer_read_limit`` or ``max_saved_body``, an ``allow_key_to`` entry that is not an
    origin), ``TypeError`` for a ``verify``, ``cert``, ``proxy`` or ``allow_key_to`` of the wrong
    type, ``FileNotFoundError`` (``OSError``) for a TLS file that cannot be read,
    ``RuntimeError`` when the ledger cannot be opened.

    Args:
        max_attempts: attempts per operation, the first included. Default: 5.
        base_delay: the first backoff ceiling, in seconds (full jitter below it, doubling per
            retry). Default: 0.5.
        max_delay: the backoff cap, in seconds. Default: 30.
        attempt_timeout: each attempt's limit in seconds, used only for a request without an
            httpx timeout (``httpx.Timeout(None)``): otherwise the longest of the request's
            connect, read, write and pool timeouts is the attempt timeout. Default: 30.
        reconcile_window: seconds from the first attempt after which the operation is never
            sent again (the receiver may have forgotten the key). Default: 86400.
        max_retry_after: the longest ``Retry-After`` honoured, in seconds; a longer one ends the
            operation. Default: 60.
        max_in_progress_wait: seconds to wait out a receiver that answers that the operation
            is still in progress (a keyed ``409 Conflict``, as Stripe and idempotency
            middlewares answer while a request with the key runs: often this operation's own
            attempt that timed out). Those answers are waits, not attempts: they do not count
            toward ``max_attempts`` (``Report.in_progress_waits``). When this runs out, the
            operation stops on the last 409: ``HTTPStatusError`` with ``kind``
            ``"still_in_progress"`` and outcome ``"unknown"`` (send it again later with the
            same key; see ``raise_on_unknown``). 0 stops at the first such answer.
            Default: 60.
        key_header: the idempotency key's header. Default: ``Idempotency-Key``.
        ledger: an SQLite file's path (created if missing) or a ``postgres://`` URL: every keyed
            operation is claimed there before its first attempt, and a succeeded one is
            answered from it (``Report.replayed``) by any process, Python or Rust, on the same
            ledger. Default: none.
        lease: seconds a ledger lease lasts unless its run renews it (renewed every third of it
            while the run lives; a killed process's key is taken over within this). Default: 10.
        lease_wait: seconds to wait for another run holding the key's lease (its answer is
            replayed, or its key taken over once its lease lapses) before raising
            ``LeaseHeldError``; 0 raises at once. Default: 240 (4 min), the same as Rust and
            idemcurl.
        max_saved_body: bytes. The longest answer body the ledger keeps for a replay; a longer
            one is handed over whole but saved without its body (the row keeps its status,
            headers and ``Content-Length``). Default: 65536 (64 KiB, the Rust crate's: an API's
            JSON answer with room to spare, and a row every process on the ledger can read
            quickly); a longer answer is fetched again, not lost (``fetch_unsaved_answers``).
        fetch_unsaved_answers: what a later run does with a succeeded operation whose body
            the ledger did not keep. ``True``: inside the operation's reconcile window it sends
            it again with its key and returns the receiver's answer from its own store
            (``Report.refetched``); this cannot repeat the effect, for the reason a retry
            cannot: the receiver still holds the key inside the window. ``False``, or past
            the window: ``AnswerNotSavedError`` (outcome ``"done"``, ``status`` the saved
            answer's; its message names the key, the size and the limit), nothing sent. Never
            an empty body as the answer. Default: ``True``.
        worker: this process's name in the ledger's rows. Default: a random UUID.
        ledger_scope: the scope every operation is filed under. Default: the URL's host.
        retry_budget: whether a token bucket limits retries across the transport. Default: on.
        budget_capacity: the bucket's tokens (it starts full). Default: 500.
        budget_retry_cost: what a failed retry costs. Default: 5.
        budget_timeout_cost: what a retry that timed out costs. Default: 10.
        budget_success_reward: what a first-attempt success gives back. Default: 1.
        verify: how servers' certificates are checked (httpx hands a custom transport none of
            the client's ``verify=``, so give it here). ``True``: against the platform's trust
            store (rustls with the platform verifier). ``False``: not at all (testing only).
            A path (``str`` or ``os.PathLike``) of a PEM file of CA certificates: against those
            roots only, as httpx's ``verify="ca.pem"`` does (a file: not a directory of
            hashed certificates, which httpx also takes). An ``ssl.SSLContext`` is refused
            with ``TypeError`` (its trust store cannot be read back): pass the CA file's path
            instead. ``FileNotFoundError``/``OSError`` for a file that cannot be read,
            ``ValueError`` for one without a PEM certificate. Default: ``True``.
        cert: a client certificate for servers that ask for one (mutual TLS): the path of a PEM
            file holding the certificate (chain) and its private key, or a ``(certificate,
            key)`` pair of PEM files. An encrypted key (httpx's third ``password`` item) is
            refused with ``ValueError``: decrypt it first (``openssl pkey -in key.pem -out
            plain.pem``). The same errors as ``verify`` for a bad file. Default: none.
        proxy: an ``http://`` or ``https://`` proxy URL (no SOCKS) that every request goes
            through, HTTPS ones tunnelled with ``CONNECT``; credentials in the URL
            are sent as ``Proxy-Authorization``. Give it here, not to the httpx client: httpx
            sends a client's ``proxy=`` through a transport of its own, past this one (and
            ignores the environment's proxies once a transport is given). ``ValueError`` for a
            URL that is not one.
            Default: none, a direct connection.
        answer_read_limit: bytes. An answer whose ``Content-Length`` is at most this is read
            whole inside its attempt, before the response is handed over: a body cut midway
            (the head arrived, then the connection closed) is a failed attempt, retried with
            the same key (the receiver answers again from its store) and counted in the
            report. A longer answer, or one without a length (chunked, server-sent events), is
            streamed to httpx as it arrives; if its body is cut midway, reading it raises
            ``ReadError`` (outcome ``"done"``) whose message names the key: send the same
            request again with that key to have the answer again. Default: 1048576 (1 MiB).
        allow_key_to: origins (``"https://api-eu.example.com"``) besides a request's own that
            its key may go to when httpx follows a redirect that resends the operation (307,
            308; 301 on a method other than ``POST``): such a hop is part of the operation,
            with the key, and a ledger records its answer. A hop to any other origin is a
            request of its own: sent once, without the key (httpx would send it), its answer
            returned but not recorded; the ledger keeps the redirect itself as the operation's
            last answer, not done. ``TypeError`` for anything but a list of str, ``ValueError``
            for one that is not a ``scheme://host[:port]`` origin. Default: none, the
            request's own origin only.
        seal_keys: keys that seal saved answers at rest, each ``"ID:HEX"`` (an id, a colon,
            64 hexadecimal digits of secret: ``openssl rand -hex 32``). The first seals each
            answer's headers and body (XChaCha20-Poly1305, bound to its row); every key opens
            the rows sealed under its id, so a rotation puts the new key first and keeps the
            old ones until their rows expire. A sealed answer no given key opens is never
            replayed: ``LedgerError`` naming the key id it needs, nothing sent. Read keys from
            a secret store, not from source. ``ValueError`` for a key not of that form.
            Default: none, answers stored as they came.
        keep_query_params: the query parameters whose values a ledger row's URL keeps; every
            other value is stored as ``…`` (``?api_key=…``), names kept. Default: none.
        raise_on_unknown: what an operation whose retries stopped on a response that is not a
            final answer gives (every attempt answered 503, a 429 whose ``Retry-After`` is
            longer than ``max_retry_after``, a 409 "in progress" past
            ``max_in_progress_wait``, a spent retry budget, the reconcile window's end: the
            outcome ``"unknown"``, or ``"not_done"``). ``None`` (the default): a keyed
            operation (every ``POST`` and ``PATCH``, and any request under a key) raises
            ``HTTPStatusError`` (``httpx.HTTPStatusError`` and ``OperationError``: ``outcome``,
            ``key``, ``attempts``, ``kind``, ``history``, and ``response``, the last
            response, its body read, its ``Report`` in its extensions), as the Rust client
            returns an error and idemcurl exits 76; a keyless request (``GET``, ``PUT``,
            ``DELETE``, ... without a key) returns that response, as httpx does: its method
            makes a repeat safe, so there is no operation to settle, only a status to check
            (``response.raise_for_status()``). ``True``: raise for keyless requests too.
            ``False``: return the response for every request, its ``Report.stopped`` and
            ``Report.outcome`` saying why (the behaviour before 0.2). A final answer (2xx, a
            4xx such as 400) is always returned. ``TypeError`` for anything but ``None`` or a
            bool.
"""


class SyncEngineTransport:
    """The sync transport's work, for any httpx flavour: ``_hx`` is the httpx module,
    ``_errors`` its exception classes. ``Transport`` is it for httpx."""

    _hx: Any = httpx
    _errors: ErrorTypes = HTTPX
    _engine: _native.Engine
    _raise_on_unknown: Optional[bool]

    def __init__(
        self,
        *,
        max_attempts: Optional[int] = None,
        base_delay: Optional[float] = None,
        max_delay: Optional[float] = None,
        attempt_timeout: Optional[float] = None,
        reconcile_window: Optional[float] = None,
        max_retry_after: Optional[float] = None,
        key_header: Optional[str] = None,
        ledger: Union[str, "os.PathLike[str]", None] = None,
        lease: Optional[float] = None,
        lease_wait: Optional[float] = None,
        worker: Optional[str] = None,
        ledger_scope: Optional[str] = None,
        retry_budget: bool = True,
        budget_capacity: Optional[int] = None,
        budget_retry_cost: Optional[int] = None,
        budget_timeout_cost: Optional[int] = None,
        budget_success_reward: Optional[int] = None,
        verify: Verify = True,
        cert: Optional[Cert] = None,
        proxy: Optional[str] = None,
        answer_read_limit: Optional[int] = None,
        max_in_progress_wait: Optional[float] = None,
        max_saved_body: Optional[int] = None,
        fetch_unsaved_answers: bool = True,
        raise_on_unknown: Optional[bool] = None,
        allow_key_to: Sequence[str] = (),
        seal_keys: Sequence[str] = (),
        keep_query_params: Sequence[str] = (),
    ) -> None:
        self._raise_on_unknown = _raise_on_unknown(raise_on_unknown)
        # None leaves an option at the engine's default.
        self._engine = _native.Engine(
            max_attempts=max_attempts,
            base_delay=base_delay,
            max_delay=max_delay,
            attempt_timeout=attempt_timeout,
            reconcile_window=reconcile_window,
            max_retry_after=max_retry_after,
            key_header=key_header,
            ledger=None if ledger is None else os.fspath(ledger),
            lease=lease,
            lease_wait=lease_wait,
            worker=worker,
            ledger_scope=ledger_scope,
            retry_budget=retry_budget,
            budget_capacity=budget_capacity,
            budget_retry_cost=budget_retry_cost,
            budget_timeout_cost=budget_timeout_cost,
            budget_success_reward=budget_success_reward,
            proxy=_proxy(proxy),
            answer_read_limit=answer_read_limit,
            max_in_progress_wait=max_in_progress_wait,
            max_saved_body=max_saved_body,
            fetch_unsaved_answers=fetch_unsaved_answers,
            allow_key_to=_origins(allow_key_to),
            seal_keys=_strings("seal_keys", seal_keys),
            keep_query_params=_strings("keep_query_params", keep_query_params),
            **_tls(verify, cert),
        )

    def handle_request(self, request: Any) -> Any:
        outgoing, buffered = _outgoing(self._engine, self._hx, request)
        stream = None
        if not buffered:
            stream = _native.BodyStream()
            threading.Thread(
                target=_feed_sync, args=(request.stream, stream), daemon=True
            ).start()
        try:
            answer = self._engine.send(
                outgoing.method,
                outgoing.url,
                outgoing.headers,
                body=stream if stream is not None else outgoing.body,
                key=outgoing.key,
                timeout=_timeout(request),
                keyless=outgoing.keyless,
                after=outgoing.after,
            )
        except ValueError as error:
            raise self._errors.refused(error, request) from None
        if buffered:
            _mark(self._hx, request, outgoing, answer)
        if _raises(self._raise_on_unknown, answer):
            raise _status_error(self._hx, self._errors, answer, request, _drain(answer))
        return _finish(self._hx, self._errors, answer, request, sync=True)

    def close(self) -> None:
        """Closes the ledger, if any (an SQLite file checkpoints its log)."""
        self._engine.close()


class Transport(SyncEngineTransport, httpx.BaseTransport):
    """An httpx transport that sends each request as one operation of the idempotent-retry
    engine: one idempotency key on every attempt (the ``idempotency_key`` block's, the
    request's key header, or a random one minted once for a non-idempotent method), transient
    failures retried with capped full-jitter backoff that honours ``Retry-After``, and, with
    ``ledger=``, a durable record that answers a repeat from the saved response.

    A failure without an answer raises httpx's own exception types, subclassed with the
    outcome (``OperationError``); so does a keyed operation whose retries stopped on a
    response that is not a final answer (``HTTPStatusError``, with that response:
    ``raise_on_unknown=``). A response carries a ``Report`` in
    ``response.extensions["idempotent_retry"]``. Requests wait with the GIL released, on one
    runtime shared by every transport of the process. Redirects are httpx's to follow
    (``follow_redirects``); one it follows is part of the same operation: the hop that resends
    it goes with the key and the bytes already read (to the same origin, or one in
    ``allow_key_to=``), and a ledger records the final answer under the request as first sent.
    """

    __doc__ = (__doc__ or "") + _OPTIONS_DOC


def _feed_sync(source: Any, stream: Any) -> None:
    try:
        for chunk in source:
            stream.push(bytes(chunk))
    except Exception as error:  # the source's failure fails the request
        stream.fail(f"the request body's stream raised {error!r}")
    else:
        stream.finish()


async def _feed_async(source: Any, stream: Any) -> None:
    try:
        async for chunk in source:
            stream.push(bytes(chunk))
    except Exception as error:
        stream.fail(f"the request body's stream raised {error!r}")
    else:
        stream.finish()


def _settle(future: asyncio.Future[Any], answer: Any) -> None:
    if not future.done():
        future.set_result(answer)


class AsyncEngineTransport:
    """The async transport's work, for any httpx flavour (see ``SyncEngineTransport``)."""

    _hx: Any = httpx
    _errors: ErrorTypes = HTTPX
    _engine: _native.Engine
    _raise_on_unknown: Optional[bool]

    __init__ = SyncEngineTransport.__init__

    async def handle_async_request(self, request: Any) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_native.Answer] = loop.create_future()

        def done(answer: Any) -> None:
            try:
                loop.call_soon_threadsafe(_settle, future, answer)
            except RuntimeError:
                pass  # the loop is closed: nobody waits for this answer

        outgoing, buffered = _outgoing(self._engine, self._hx, request)
        stream = None
        if not buffered:
            stream = _native.BodyStream()
        try:
            pending = self._engine.start(
                outgoing.method,
                outgoing.url,
                outgoing.headers,
                done,
                body=stream if stream is not None else outgoing.body,
                key=outgoing.key,
                timeout=_timeout(request),
                keyless=outgoing.keyless,
                after=outgoing.after,
            )
        except ValueError as error:
            raise self._errors.refused(error, request) from None
        feeder = None
        if stream is not None:
            source = request.stream
            if hasattr(source, "__aiter__"):
                feeder = asyncio.ensure_future(_feed_async(source, stream))
            else:
                threading.Thread(
                    target=_feed_sync, args=(source, stream), daemon=True
                ).start()
        try:
            answer = await future
        except asyncio.CancelledError:
            # The caller gave up (a timeout around it, a cancelled task): the operation is
            # dropped where it stands, its ledger lease given back.
            pending.cancel()
            raise
        finally:
            if feeder is not None and not feeder.done():
                feeder.cancel()
        if buffered:
            _mark(self._hx, request, outgoing, answer)
        if _raises(self._raise_on_unknown, answer):
            if answer.rest is None:
                body = answer.body or b""
            else:
                body = await loop.run_in_executor(None, _drain, answer)
            raise _status_error(self._hx, self._errors, answer, request, body)
        return _finish(self._hx, self._errors, answer, request, sync=False)

    async def aclose(self) -> None:
        """Closes the ledger, if any, without blocking the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self._engine.close)


class AsyncTransport(AsyncEngineTransport, httpx.AsyncBaseTransport):
    """The asyncio form of ``Transport``: the same engine and options; each request runs on
    the shared runtime and completes an asyncio future, so the event loop is never blocked.

    A task cancelled while its request is under way drops the operation where it stands, as a
    Rust caller's dropped future does: an attempt in flight is abandoned (the receiver may
    still run it: send it again later with the same key), and a ledger's lease is given back.
    """

    __doc__ = (__doc__ or "") + _OPTIONS_DOC
