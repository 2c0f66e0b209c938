"""asyncio: the AsyncTransport under load and faults, the event loop never blocked."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST


def test_200_concurrent_keyed_posts_all_correct(receiver):
    keys = [ir.derive("test.async", [str(n)]) for n in range(200)]
    # Every tenth operation meets a 503 first, every seventh a reset after its effect.
    for n, key in enumerate(keys):
        if n % 10 == 0:
            receiver.inject("status", key=key, attempt=1, status=503)
        elif n % 7 == 0:
            receiver.inject("reset_after_commit", key=key, attempt=1)

    async def main():
        async with httpx.AsyncClient(
            transport=ir.AsyncTransport(**FAST),
            limits=httpx.Limits(max_connections=None),
            timeout=10,
        ) as client:

            async def one(n, key):
                response = await client.post(
                    receiver.url("/v1/charges"),
                    json={"amount": n},
                    headers={"Idempotency-Key": key},
                )
                return n, key, response

            return await asyncio.gather(*(one(n, key) for n, key in enumerate(keys)))

    results = asyncio.run(main())
    assert len(results) == 200
    for n, key, response in results:
        assert response.status_code == 200, (n, response.status_code)
        assert response.extensions["idempotent_retry"].key == key
        expected = 2 if n % 10 == 0 or n % 7 == 0 else 1
        assert response.extensions["idempotent_retry"].attempts == expected, n
        assert receiver.effects_for(key) == 1
    assert receiver.effects() == 200


def test_the_event_loop_runs_while_a_request_waits(receiver):
    receiver.inject("slow_handler", key="k-slow", attempt=1, seconds=0.5)
    ticks = []

    async def ticker():
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.02)

    async def main():
        async with httpx.AsyncClient(transport=ir.AsyncTransport(**FAST)) as client:
            task = asyncio.ensure_future(ticker())
            response = await client.post(
                receiver.url("/v1/charges"), content=b"x", headers={"Idempotency-Key": "k-slow"}
            )
            task.cancel()
            return response

    response = asyncio.run(main())
    assert response.status_code == 200
    # 0.5 s of waiting, a tick every 20 ms: the loop kept running.
    assert len(ticks) >= 10


def test_async_errors_are_httpx_errors_with_the_outcome(receiver):
    for attempt in (1, 2):
        receiver.inject("stall_after_commit", key="k-astall", attempt=attempt, seconds=5)

    async def main():
        async with httpx.AsyncClient(
            transport=ir.AsyncTransport(max_attempts=2, **FAST), timeout=0.3
        ) as client:
            await client.post(
                receiver.url("/v1/charges"), content=b"x", headers={"Idempotency-Key": "k-astall"}
            )

    with pytest.raises(httpx.ReadTimeout) as raised:
        asyncio.run(main())
    assert raised.value.outcome == "unknown"
    assert raised.value.key == "k-astall"
    assert raised.value.attempts == 2


def test_an_async_streamed_body_goes_out_whole(receiver):
    async def chunks():
        yield b'{"amount": '
        await asyncio.sleep(0.01)
        yield b"9}"

    async def main():
        async with httpx.AsyncClient(transport=ir.AsyncTransport(**FAST)) as client:
            return await client.post(
                receiver.url("/v1/charges"), content=chunks(), headers={"Idempotency-Key": "k-as"}
            )

    response = asyncio.run(main())
    assert response.status_code == 200
    assert receiver.effects_for("k-as") == 1


def test_a_cancelled_task_drops_the_operation_and_frees_its_lease(receiver, tmp_path):
    ledger = str(tmp_path / "ledger.sqlite3")
    receiver.inject("stall_after_commit", key="k-cancel", attempt=1, seconds=5)

    async def main():
        transport = ir.AsyncTransport(ledger=ledger, **FAST)
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            request = client.post(
                receiver.url("/v1/charges"), content=b"x", headers={"Idempotency-Key": "k-cancel"}
            )
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(request, 0.5)
            # The lease was given back: the same operation goes out again at once (no
            # LeaseHeldError) and meets the receiver's saved answer.
            return await client.post(
                receiver.url("/v1/charges"), content=b"x", headers={"Idempotency-Key": "k-cancel"}
            )

    response = asyncio.run(main())
    assert response.status_code == 200
    assert response.headers["Idempotent-Replayed"] == "true"
    assert receiver.keys() == ["k-cancel", "k-cancel"]
    assert receiver.effects_for("k-cancel") == 1
