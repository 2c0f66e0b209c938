"""Keys: the derivations are byte for byte the Rust crate's (its golden vectors, from
src/keys/key.rs), and the key a request goes out under."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST


def test_derive_matches_the_rust_golden_vectors():
    assert (
        ir.derive("agent.send_email", ["conv_42", "7"])
        == "c773f371188e7c30df068e84cff87cf4102e2ebe19bc21c186155202b0a911ac"
    )
    assert (
        ir.derive("stripe.charge", [])
        == "b0f423ac270e41fb773183f83c1db0480ae2fc248c7d7aec1dde2038addc7d4a"
    )
    assert ir.derive("stripe.charge") == ir.derive("stripe.charge", [])
    assert (
        ir.derive("", [""])
        == "ef688f0c3d8b083f0e7a04cafa44544e4cd4d4ad44961c9221c6a6ed99945b9b"
    )
    assert (
        ir.derive("caf\u00e9.\u00fcn\u00efc\u00f6d\u00e9", ["\u65e5\u672c\u8a9e", "\U0001f600"])
        == "5bbf276a9b9c65a1e9db1c3f238f3670c43d21c5eaf70efc155e089cd0c77f7c"
    )


def test_for_tool_call_matches_the_rust_golden_vectors():
    assert (
        ir.for_tool_call("send_email", {"to": "a@example.com", "subject": "hi"})
        == "279044b9ab0b0cf79c8744562eeb1f4d99ab999a0d602a5448a5205a1b42ff42"
    )
    assert (
        ir.for_tool_call("translate", {"text": "Gr\u00fc\u00dfe \U0001f600", "\ue000": 1})
        == "a53c276a9bab1ac3d5b865425ccb1c274ddb4fe64641d15f6fa2e8db95f494ff"
    )


def test_for_tool_call_is_the_same_for_the_same_arguments_in_any_order():
    assert ir.for_tool_call("t", {"a": 1, "b": [1.0, "x"]}) == ir.for_tool_call(
        "t", {"b": [1, "x"], "a": 1}
    )
    assert ir.for_tool_call("t", {"a": 1}) != ir.for_tool_call("u", {"a": 1})


def test_for_tool_call_refuses_nan():
    with pytest.raises(ValueError):
        ir.for_tool_call("t", {"a": float("nan")})


def test_the_key_header_on_the_request_is_the_key(receiver):
    client = httpx.Client(transport=ir.Transport(**FAST))
    response = client.post(
        receiver.url("/v1/charges"), json={"amount": 1}, headers={"Idempotency-Key": "given-1"}
    )
    assert response.status_code == 200
    assert response.extensions["idempotent_retry"].key == "given-1"
    assert receiver.keys() == ["given-1"]


def test_a_post_without_a_key_gets_one_and_a_get_none(receiver):
    client = httpx.Client(transport=ir.Transport(**FAST))
    posted = client.post(receiver.url("/v1/charges"), content=b"x")
    got = client.get(receiver.url("/v1/charges"))
    minted = posted.extensions["idempotent_retry"].key
    assert minted and len(minted) == 36
    assert got.extensions["idempotent_retry"].key is None
    assert receiver.keys() == [minted, None]


def test_the_context_key_wins_over_a_header_set_by_a_library(receiver):
    client = httpx.Client(transport=ir.Transport(**FAST))
    with ir.idempotency_key("op-7") as key:
        assert ir.current_idempotency_key() == key
        client.post(
            receiver.url("/v1/charges"), content=b"x", headers={"Idempotency-Key": "sdk-random"}
        )
    assert ir.current_idempotency_key() is None
    client.post(receiver.url("/v1/charges"), content=b"y")
    keys = receiver.keys()
    assert keys[0] == "op-7"
    assert keys[1] not in (None, "op-7")


def test_the_context_key_follows_each_asyncio_task(receiver):
    async def main():
        async with httpx.AsyncClient(transport=ir.AsyncTransport(**FAST)) as client:

            async def one(n):
                with ir.idempotency_key(f"task-{n}"):
                    await asyncio.sleep(0.01 * (3 - n))
                    return await client.post(receiver.url("/v1/t"), content=str(n).encode())

            return await asyncio.gather(*(one(n) for n in range(3)))

    responses = asyncio.run(main())
    assert [r.extensions["idempotent_retry"].key for r in responses] == [
        "task-0",
        "task-1",
        "task-2",
    ]


def test_a_custom_key_header(receiver):
    client = httpx.Client(transport=ir.Transport(key_header="X-Request-Id", **FAST))
    client.post(receiver.url("/v1/charges"), content=b"x", headers={"X-Request-Id": "rid-1"})
    # The receiver reads Idempotency-Key: the key went out under the other name.
    assert receiver.keys() == [None]


def test_an_invalid_key_is_refused_before_anything_is_sent(receiver):
    client = httpx.Client(transport=ir.Transport(**FAST))
    with pytest.raises(ir.InvalidRequest) as raised:
        with ir.idempotency_key("bad key\n"):
            client.post(receiver.url("/v1/charges"), content=b"x")
    assert raised.value.outcome == "not_done"
    assert isinstance(raised.value, httpx.RequestError)
    assert receiver.arrivals() == 0
