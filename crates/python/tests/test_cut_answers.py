"""An answer whose head arrived and whose body was then cut, after the effect, through both
transports: a bounded one (a ``Content-Length`` up to ``answer_read_limit``) is a failed
attempt, retried with its key, so the caller gets the whole answer and the receiver shows one
effect; a streamed one raises while it is read, naming its key, and the same request sent
again with that key gets the answer."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST

#: The built-in handler's answer to the first delivery of a key: ``{"effect":1}``, 12 bytes.
ANSWER = {"effect": 1}


def report(response: httpx.Response) -> ir.Report:
    return response.extensions["idempotent_retry"]


def charge(flavour: str, receiver, key: str, **options) -> httpx.Response:
    """A keyed charge through a new transport of `flavour` (``sync`` or ``async``) with
    `options`, its body read as httpx reads it."""
    url = receiver.url("/v1/charges")
    headers = {"Idempotency-Key": key}
    if flavour == "sync":
        with httpx.Client(transport=ir.Transport(**FAST, **options)) as client:
            return client.post(url, json={"amount": 500}, headers=headers)

    async def main() -> httpx.Response:
        async with httpx.AsyncClient(transport=ir.AsyncTransport(**FAST, **options)) as client:
            return await client.post(url, json={"amount": 500}, headers=headers)

    return asyncio.run(main())


@pytest.mark.parametrize("with_ledger", [False, True], ids=["no-ledger", "ledger"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_bounded_answer_cut_mid_body_is_retried_with_its_key_and_read_whole(
    receiver, tmp_path, flavour, with_ledger
):
    key = f"k-cut-{flavour}-{with_ledger}"
    # The first delivery runs (one effect), then its answer's head goes out with 5 of its 12
    # body bytes, and the connection closes.
    receiver.inject("cut_body_after_commit", key=key, attempt=1, keep_bytes=5)
    options = {"ledger": tmp_path / "ledger.sqlite3"} if with_ledger else {}
    response = charge(flavour, receiver, key, **options)
    assert response.status_code == 200
    assert response.json() == ANSWER
    # The receiver answered the retry from its store.
    assert response.headers["Idempotent-Replayed"] == "true"
    got = report(response)
    assert got.attempts == 2
    assert got.key == key
    assert [(a.number, a.failure) for a in got.history] == [
        (1, "connection_closed"),
        (2, None),
    ]
    assert receiver.keys() == [key, key]
    assert receiver.effects_for(key) == 1


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_streamed_answer_cut_mid_body_names_its_key_and_sending_it_again_gets_the_answer(
    receiver, flavour
):
    key = f"k-cut-streamed-{flavour}"
    receiver.inject("cut_body_after_commit", key=key, attempt=1, keep_bytes=3)
    # A body longer than 4 bytes streams: the 12-byte answer is cut while httpx reads it.
    with pytest.raises(httpx.ReadError) as raised:
        charge(flavour, receiver, key, answer_read_limit=4)
    error = raised.value
    assert isinstance(error, ir.OperationError)
    # The answer's head arrived: the operation is done, and its effect stands.
    assert error.outcome == "done"
    assert error.key == key
    assert error.attempts == 1
    message = str(error)
    assert "the answer's body was cut after the receiver answered 200" in message, message
    assert "effect may stand" in message, message
    assert f"send the same request again with idempotency key {key}" in message, message
    assert receiver.effects_for(key) == 1

    # The same request, sent again with its key: the receiver answers from its store.
    again = charge(flavour, receiver, key, answer_read_limit=4)
    assert again.status_code == 200
    assert again.json() == ANSWER
    assert again.headers["Idempotent-Replayed"] == "true"
    assert report(again).attempts == 1
    assert receiver.keys() == [key, key]
    assert receiver.effects_for(key) == 1


def test_the_fault_sends_the_head_and_part_of_the_body(receiver):
    receiver.inject("cut_body_after_commit", key="k-cut-log", attempt=1, keep_bytes=5)
    charge("sync", receiver, "k-cut-log")
    assert any("answer cut after 5 bytes of its body" in line for line in receiver.log()), (
        receiver.log()
    )
