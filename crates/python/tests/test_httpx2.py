"""The transports for httpx2 (`idempotent_retry.httpx2`): the same engine under httpx2's
clients, raising httpx2's exception types."""

from __future__ import annotations

import asyncio
import os

import pytest

import idempotent_retry as ir
from conftest import FAST

if os.environ.get("CI"):
    # CI installs the pinned httpx2 (requirements.txt): a missing one is a failure there.
    import httpx2
else:
    httpx2 = pytest.importorskip("httpx2")

from idempotent_retry import httpx2 as ir2  # noqa: E402


def test_503_then_200_through_an_httpx2_client(receiver):
    receiver.inject("status", key="k2-503", attempt=1, status=503)
    with httpx2.Client(transport=ir2.Transport(**FAST)) as client:
        response = client.post(
            receiver.url("/v1/charges"), content=b"x", headers={"Idempotency-Key": "k2-503"}
        )
    assert isinstance(response, httpx2.Response)
    assert response.status_code == 200
    assert response.extensions["idempotent_retry"].attempts == 2
    assert receiver.keys() == ["k2-503", "k2-503"]
    assert receiver.effects_for("k2-503") == 1


def test_httpx2_errors_are_httpx2_types_with_the_outcome(receiver):
    for attempt in (1, 2):
        receiver.inject("stall_after_commit", key="k2-stall", attempt=attempt, seconds=5)
    with pytest.raises(httpx2.TimeoutException) as raised:
        httpx2.Client(transport=ir2.Transport(max_attempts=2, **FAST), timeout=0.3).post(
            receiver.url("/v1/charges"), content=b"x", headers={"Idempotency-Key": "k2-stall"}
        )
    assert isinstance(raised.value, httpx2.ReadTimeout)
    assert isinstance(raised.value, ir.OperationError)
    assert raised.value.outcome == "unknown"
    assert raised.value.key == "k2-stall"


def test_concurrent_keyed_posts_through_the_httpx2_async_transport(receiver):
    keys = [ir.derive("test.httpx2", [str(n)]) for n in range(50)]
    for key in keys[::5]:
        receiver.inject("reset_after_commit", key=key, attempt=1)

    async def main():
        async with httpx2.AsyncClient(transport=ir2.AsyncTransport(**FAST)) as client:
            return await asyncio.gather(
                *(
                    client.post(receiver.url("/v1/c"), content=b"x", headers={"Idempotency-Key": k})
                    for k in keys
                )
            )

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [200] * 50
    assert all(receiver.effects_for(key) == 1 for key in keys)


def test_every_attempt_503_raises_httpx2s_http_status_error_sync_and_async(receiver):
    for key in ("k2-down", "k2-adown"):
        for attempt in (1, 2):
            receiver.inject("status", key=key, attempt=attempt, status=503)

    def sync():
        with httpx2.Client(transport=ir2.Transport(max_attempts=2, **FAST)) as client:
            client.post(
                receiver.url("/v1/charges"), content=b"x", headers={"Idempotency-Key": "k2-down"}
            )

    async def main():
        async with httpx2.AsyncClient(transport=ir2.AsyncTransport(max_attempts=2, **FAST)) as c:
            await c.post(
                receiver.url("/v1/charges"), content=b"x", headers={"Idempotency-Key": "k2-adown"}
            )

    for key, run in (("k2-down", sync), ("k2-adown", lambda: asyncio.run(main()))):
        with pytest.raises(httpx2.HTTPStatusError) as raised:
            run()
        error = raised.value
        assert isinstance(error, ir2.HTTPStatusError)
        assert isinstance(error, ir.OperationError)
        assert error.outcome == "unknown"
        assert error.key == key
        assert error.attempts == 2
        assert [a.status for a in error.history] == [503, 503]
        assert isinstance(error.response, httpx2.Response)
        assert error.response.status_code == 503
        assert isinstance(error.response.content, bytes)
        assert error.response.extensions["idempotent_retry"].key == key
        assert receiver.keys().count(key) == 2
    assert receiver.effects() == 0
