"""An answer whose body was longer than the ledger keeps (``max_saved_body=``): a later run
never hands over an empty body as the answer. Inside the window it sends the operation again
with its key and the receiver answers from its store (``Report.refetched``); with
``fetch_unsaved_answers=False`` it raises ``AnswerNotSavedError`` (outcome done) and sends
nothing."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST

#: The test receiver's answer to a key's first delivery: 12 bytes.
ANSWER = b'{"effect":1}'
#: Shorter than ANSWER: the ledger keeps its status and headers, not its body.
SHORT_LIMIT = 8


def charge(ledger, receiver, key, **options):
    transport = ir.Transport(ledger=str(ledger), **{**FAST, **options})
    try:
        with httpx.Client(transport=transport) as client:
            return client.post(
                receiver.url("/v1/charges"),
                json={"amount": 500},
                headers={"Idempotency-Key": key},
            )
    finally:
        transport.close()


def report(response) -> ir.Report:
    return response.extensions["idempotent_retry"]


def test_an_answer_longer_than_the_limit_is_fetched_again_with_its_key_whole(receiver, tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    first = charge(ledger, receiver, "k-long", max_saved_body=SHORT_LIMIT)
    assert first.status_code == 200
    assert first.content == ANSWER
    assert report(first).refetched is False

    again = charge(ledger, receiver, "k-long", max_saved_body=SHORT_LIMIT)
    assert again.status_code == 200
    assert again.content == ANSWER, "the whole body, never an empty one"
    assert report(again).refetched is True
    assert report(again).replayed is False
    assert report(again).attempts == 1
    # The receiver answered the second request from its store under the one key.
    assert again.headers["Idempotent-Replayed"] == "true"
    assert receiver.keys() == ["k-long", "k-long"]
    assert receiver.effects_for("k-long") == 1


def test_the_async_transport_fetches_it_again_too(receiver, tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    charge(ledger, receiver, "k-long-async", max_saved_body=SHORT_LIMIT)

    async def again():
        transport = ir.AsyncTransport(ledger=str(ledger), max_saved_body=SHORT_LIMIT, **FAST)
        async with httpx.AsyncClient(transport=transport) as client:
            return await client.post(
                receiver.url("/v1/charges"),
                json={"amount": 500},
                headers={"Idempotency-Key": "k-long-async"},
            )

    response = asyncio.run(again())
    assert response.content == ANSWER
    assert report(response).refetched is True
    assert receiver.keys() == ["k-long-async", "k-long-async"]
    assert receiver.effects_for("k-long-async") == 1


def test_with_fetching_off_answer_not_saved_names_the_key_and_nothing_is_sent(receiver, tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    charge(ledger, receiver, "k-kept-off", max_saved_body=SHORT_LIMIT)

    with pytest.raises(ir.AnswerNotSavedError) as raised:
        charge(
            ledger, receiver, "k-kept-off", max_saved_body=SHORT_LIMIT, fetch_unsaved_answers=False
        )
    error = raised.value
    assert isinstance(error, httpx.TransportError)
    assert isinstance(error, ir.OperationError)
    assert error.outcome == "done" and not error.is_outcome_unknown
    assert error.status == 200
    assert error.key == "k-kept-off"
    assert error.kind == "answer_not_saved"
    assert error.attempts == 0
    message = str(error)
    for part in (
        "k-kept-off",
        f"its answer's body ({len(ANSWER)} bytes) was longer than the ledger keeps "
        f"({SHORT_LIMIT} bytes, max_saved_body=)",
        "nothing was sent",
        "fetch_unsaved_answers=True",
    ):
        assert part in message, message
    assert "LedgerOptions" not in message, message
    assert receiver.arrivals() == 1


def test_an_answer_within_the_limit_replays_from_the_ledger(receiver, tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    charge(ledger, receiver, "k-kept", max_saved_body=len(ANSWER))
    again = charge(ledger, receiver, "k-kept", max_saved_body=len(ANSWER))
    assert again.content == ANSWER
    assert report(again).replayed is True
    assert report(again).refetched is False
    assert receiver.arrivals() == 1
