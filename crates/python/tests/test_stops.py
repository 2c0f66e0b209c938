"""An operation whose retries stop on a response that is not a final answer (every attempt
503, a 409 "in progress" after a timeout) raises ``HTTPStatusError``, both the package's and
httpx's, through the sync and async transports, with the last response read; keyless
requests and ``raise_on_unknown=False`` get the response back, a final answer is returned."""

from __future__ import annotations

import asyncio
import datetime
import socket

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST, listen


def send(transport, url, *, key=None, method="POST", timeout=5.0):
    """One request through ``transport`` in an httpx client of its kind (sync or async)."""
    headers = {} if key is None else {"Idempotency-Key": key}
    content = b'{"amount": 500}' if method == "POST" else None
    if isinstance(transport, httpx.AsyncBaseTransport):

        async def main():
            async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
                return await client.request(method, url, content=content, headers=headers)

        return asyncio.run(main())
    with httpx.Client(transport=transport, timeout=timeout) as client:
        return client.request(method, url, content=content, headers=headers)


TRANSPORTS = [
    pytest.param(ir.Transport, id="sync"),
    pytest.param(ir.AsyncTransport, id="async"),
]


def every_attempt_503(receiver, key):
    for attempt in (1, 2):
        receiver.inject("status", key=key, attempt=attempt, status=503)


def timeout_then_409(receiver, key):
    # The first attempt runs the charge, then stalls past the 0.3 s timeout; the second is
    # told the operation is still in progress, and waiting for it is off.
    receiver.inject("stall_after_commit", key=key, attempt=1, seconds=5)
    receiver.inject("status", key=key, attempt=2, status=409)


@pytest.mark.parametrize("make", TRANSPORTS)
def test_every_attempt_503_raises_http_status_error_with_the_outcome(receiver, make):
    key = f"k-down-{make.__name__}"
    every_attempt_503(receiver, key)
    with pytest.raises(httpx.HTTPStatusError) as raised:
        send(make(max_attempts=2, **FAST), receiver.url("/v1/charges"), key=key)
    error = raised.value
    assert isinstance(error, ir.HTTPStatusError)
    assert isinstance(error, ir.OperationError)
    assert error.outcome == "unknown" and error.is_outcome_unknown
    assert error.key == key
    assert error.attempts == 2
    assert error.kind == "attempts_exhausted"
    assert error.status == 503
    assert [(a.number, a.status, a.failure) for a in error.history] == [
        (1, 503, "server_error"),
        (2, 503, "server_error"),
    ]
    assert isinstance(error.elapsed, datetime.timedelta)
    # httpx's own attributes, as raise_for_status() sets them, the body already read.
    assert error.request.method == "POST"
    assert error.request.url.path == "/v1/charges"
    assert error.response.status_code == 503
    assert error.response.request is error.request
    assert error.response.is_closed
    assert isinstance(error.response.content, bytes)
    assert error.response.elapsed == error.elapsed
    report = error.response.extensions["idempotent_retry"]
    assert report.stopped == "attempts_exhausted" and report.key == key
    assert "503 Service Unavailable" in str(error)
    assert key in str(error) and "outcome unknown" in str(error)
    assert receiver.keys() == [key, key]
    assert receiver.effects() == 0


@pytest.mark.parametrize("make", TRANSPORTS)
def test_a_timeout_then_409_in_progress_raises_with_the_409(receiver, make):
    key = f"k-409-{make.__name__}"
    timeout_then_409(receiver, key)
    transport = make(max_attempts=2, max_in_progress_wait=0, **FAST)
    with pytest.raises(ir.HTTPStatusError) as raised:
        send(transport, receiver.url("/v1/charges"), key=key, timeout=0.3)
    error = raised.value
    assert isinstance(error, httpx.HTTPStatusError)
    assert error.outcome == "unknown"
    assert error.key == key
    assert error.attempts == 2
    assert error.kind == "still_in_progress"
    assert [(a.number, a.status, a.failure) for a in error.history] == [
        (1, None, "timeout"),
        (2, 409, "in_progress"),
    ]
    assert error.response.status_code == 409
    assert error.response.text == error.response.content.decode()
    assert "409 Conflict" in str(error) and "max_in_progress_wait=SECONDS" in str(error)
    assert receiver.keys() == [key, key]
    # The first attempt ran it: the outcome was unknown to the caller, not undone.
    assert receiver.effects_for(key) == 1


@pytest.mark.parametrize("make", TRANSPORTS)
def test_raise_on_unknown_false_returns_the_last_response(receiver, make):
    key = f"k-back-{make.__name__}"
    every_attempt_503(receiver, key)
    transport = make(max_attempts=2, raise_on_unknown=False, **FAST)
    response = send(transport, receiver.url("/v1/charges"), key=key)
    assert response.status_code == 503
    report = response.extensions["idempotent_retry"]
    assert report.stopped == "attempts_exhausted"
    assert report.outcome == "unknown"
    assert report.attempts == 2 and report.key == key

    key = f"k-back-409-{make.__name__}"
    timeout_then_409(receiver, key)
    transport = make(max_attempts=2, max_in_progress_wait=0, raise_on_unknown=False, **FAST)
    response = send(transport, receiver.url("/v1/charges"), key=key, timeout=0.3)
    assert response.status_code == 409
    assert response.extensions["idempotent_retry"].stopped == "still_in_progress"
    assert response.extensions["idempotent_retry"].attempts == 2
    assert receiver.effects_for(key) == 1


@pytest.mark.parametrize("make", TRANSPORTS)
def test_a_final_400_is_returned_not_raised(receiver, make):
    key = f"k-400-{make.__name__}"
    receiver.inject("status", key=key, attempt=1, status=400)
    response = send(make(max_attempts=2, **FAST), receiver.url("/v1/charges"), key=key)
    assert response.status_code == 400
    assert response.extensions["idempotent_retry"].stopped is None
    assert response.extensions["idempotent_retry"].attempts == 1
    assert receiver.keys() == [key]


@pytest.mark.parametrize("make", TRANSPORTS)
def test_a_keyless_get_that_runs_out_on_503_returns_the_response(receiver, make):
    for request in (1, 2):
        receiver.inject("status", request=request, status=503)
    response = send(make(max_attempts=2, **FAST), receiver.url("/v1/items"), method="GET")
    assert response.status_code == 503
    report = response.extensions["idempotent_retry"]
    assert report.key is None
    assert report.stopped == "attempts_exhausted"
    assert report.attempts == 2
    assert receiver.keys() == [None, None]


@pytest.mark.parametrize("make", TRANSPORTS)
def test_a_keyless_get_raises_with_raise_on_unknown_true(receiver, make):
    for request in (1, 2):
        receiver.inject("status", request=request, status=503)
    transport = make(max_attempts=2, raise_on_unknown=True, **FAST)
    with pytest.raises(ir.HTTPStatusError) as raised:
        send(transport, receiver.url("/v1/items"), method="GET")
    error = raised.value
    assert error.key is None
    assert error.attempts == 2
    assert error.kind == "attempts_exhausted"
    assert error.response.status_code == 503
    assert error.request.method == "GET"
    assert [a.status for a in error.history] == [503, 503]


BUSY = b"the service is busy; " * 8


def serve_chunked_503(connection: socket.socket) -> None:
    """Answers every request on the connection 503 with a chunked body (no length: the
    transport streams it) of `BUSY`."""
    with connection:
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                chunk = connection.recv(65536)
                if not chunk:
                    return
                buffer += chunk
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            fields = dict(
                line.split(":", 1) for line in head.decode("latin-1").lower().split("\r\n")[1:]
            )
            length = int(fields.get("content-length", "0"))
            while len(buffer) < length:
                buffer += connection.recv(65536)
            buffer = buffer[length:]
            half = len(BUSY) // 2
            connection.sendall(
                b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n"
                % (half, BUSY[:half], len(BUSY) - half, BUSY[half:])
            )


@pytest.mark.parametrize("make", TRANSPORTS)
def test_a_streamed_body_of_the_last_response_is_read_whole_before_it_is_raised(make):
    listener = listen(serve_chunked_503)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1/charges"
    try:
        with pytest.raises(ir.HTTPStatusError) as raised:
            send(make(max_attempts=2, **FAST), url, key="k-chunked")
    finally:
        listener.close()
    response = raised.value.response
    assert response.status_code == 503
    assert response.is_closed
    assert response.content == BUSY
    assert response.text == BUSY.decode()
    assert raised.value.attempts == 2


def test_raise_on_unknown_takes_none_or_a_bool():
    with pytest.raises(TypeError) as raised:
        ir.Transport(raise_on_unknown="yes")  # type: ignore[arg-type]
    assert "raise_on_unknown: str is not a setting" in str(raised.value)
    assert "pass None" in str(raised.value) and "False" in str(raised.value)
