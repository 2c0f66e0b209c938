"""The SDKs that are built on httpx, with their own retries off and our transport in their
HTTP client: openai-python against a local fake chat-completions endpoint (2.x on httpx; 3.x
on httpx2, run by .ci/python after upgrading it), stripe-python's HTTPX client against the
workspace's test receiver as a charges endpoint."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST

if os.environ.get("CI"):
    # CI installs the pinned SDKs (requirements.txt): a missing one is a failure there.
    import openai
    import stripe
else:
    openai = pytest.importorskip("openai")
    stripe = pytest.importorskip("stripe")

# openai-python 3 runs on httpx2, 2.x on httpx: the client and transports of its flavour.
if int(openai.__version__.split(".")[0]) >= 3:
    import httpx2 as openai_httpx

    from idempotent_retry import httpx2 as openai_ir
else:
    openai_httpx = httpx
    openai_ir = ir

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "gpt-test",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


class FakeChat:
    """A chat-completions endpoint on loopback that answers 503 to its first `failures`
    requests (or, with `redirect`, 308 to `/v1/chat/completions/` to its first), then the
    completion; it records each request's path, idempotency key and model."""

    def __init__(self, failures=1, redirect=False):
        self.seen = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                fake.seen.append((self.path, self.headers.get("Idempotency-Key"), body["model"]))
                if redirect and len(fake.seen) == 1:
                    self.send_response(308)
                    self.send_header("Location", "/v1/chat/completions/")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if len(fake.seen) <= failures:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                answer = json.dumps(COMPLETION).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path):
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_chat():
    fake = FakeChat()
    yield fake
    fake.close()


def test_openai_one_key_across_both_attempts_with_its_own_retries_off(fake_chat):
    client = openai.OpenAI(
        api_key="sk-test",
        base_url=fake_chat.url("/v1"),
        max_retries=0,
        http_client=openai_httpx.Client(transport=openai_ir.Transport(**FAST)),
    )
    completion = client.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "hi"}]
    )
    assert completion.choices[0].message.content == "hello"
    assert len(fake_chat.seen) == 2
    (path1, key1, _), (path2, key2, _) = fake_chat.seen
    assert path1 == path2 == "/v1/chat/completions"
    # The SDK's own per-call key, sent on both of our attempts.
    assert key1 and key1 == key2


def test_openai_a_503_on_every_attempt_reaches_the_caller_with_the_outcome():
    fake = FakeChat(failures=2)
    try:
        client = openai.OpenAI(
            api_key="sk-test",
            base_url=fake.url("/v1"),
            max_retries=0,
            http_client=openai_httpx.Client(
                transport=openai_ir.Transport(max_attempts=2, **FAST)
            ),
        )
        with pytest.raises(Exception) as raised:
            client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        fake.close()
    # openai-python 3 lets the transport's exception through; 2.x wraps it in
    # APIConnectionError, ours its cause.
    error = raised.value
    if not isinstance(error, ir.OperationError):
        assert isinstance(error, openai.APIConnectionError)
        error = error.__cause__
    assert isinstance(error, openai_ir.HTTPStatusError)
    assert isinstance(error, openai_httpx.HTTPStatusError)
    assert error.outcome == "unknown"
    assert error.attempts == 2
    assert error.response.status_code == 503
    (_, key1, _), (_, key2, _) = fake.seen
    assert error.key == key1 == key2


def test_openai_async_under_a_key_of_our_own(fake_chat):
    import asyncio

    async def main():
        client = openai.AsyncOpenAI(
            api_key="sk-test",
            base_url=fake_chat.url("/v1"),
            max_retries=0,
            http_client=openai_httpx.AsyncClient(transport=openai_ir.AsyncTransport(**FAST)),
        )
        with ir.idempotency_key(ir.for_tool_call("chat", {"turn": 3})) as key:
            completion = await client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}]
            )
        return key, completion

    key, completion = asyncio.run(main())
    assert completion.choices[0].message.content == "hello"
    assert [seen[1] for seen in fake_chat.seen] == [key, key]


def test_openai_on_its_defaults_follows_a_308_as_one_operation_recorded_once(tmp_path):
    # The SDK's own httpx client settings (follow_redirects=True among them) and retries.
    default_client = getattr(openai, "DefaultHttpxClient", None) or (
        lambda **options: openai_httpx.Client(follow_redirects=True, **options)
    )
    fake = FakeChat(failures=0, redirect=True)
    transport = openai_ir.Transport(ledger=tmp_path / "ops.sqlite3", **FAST)
    try:
        client = openai.OpenAI(
            api_key="sk-test",
            base_url=fake.url("/v1"),
            http_client=default_client(transport=transport),
        )
        with ir.idempotency_key("chat-turn-7"):
            first = client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}]
            )
            again = client.chat.completions.with_raw_response.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        transport.close()
        fake.close()
    assert first.choices[0].message.content == "hello"
    assert fake.seen == [
        ("/v1/chat/completions", "chat-turn-7", "gpt-test"),
        ("/v1/chat/completions/", "chat-turn-7", "gpt-test"),
    ]
    # The re-run under the key is the recorded completion, nothing sent.
    assert again.parse().choices[0].message.content == "hello"
    assert again.http_response.extensions["idempotent_retry"].replayed
    assert len(fake.seen) == 2


class RetryingHTTPXClient(stripe.HTTPXClient):
    """stripe-python's HTTPX client, its httpx clients on our transports."""

    def __init__(self, **options):
        super().__init__(allow_sync_methods=True)
        self._client = httpx.Client(transport=ir.Transport(**options))
        self._client_async = httpx.AsyncClient(transport=ir.AsyncTransport(**options))


def stripe_client(receiver):
    return stripe.StripeClient(
        "sk_test_123",
        http_client=RetryingHTTPXClient(**FAST),
        base_addresses={"api": receiver.url("")},
        max_network_retries=0,
    )


def test_stripe_charge_through_a_503_is_made_once(receiver):
    receiver.inject("status", request=1, status=503)
    charge = stripe_client(receiver).v1.charges.create(
        params={"amount": 500, "currency": "eur", "source": "tok_visa"}
    )
    assert charge["effect"] == 1
    keys = receiver.keys()
    assert len(keys) == 2 and keys[0] and keys[0] == keys[1]
    assert receiver.effects() == 1


def test_stripe_under_a_derived_key_survives_a_reset_after_the_charge(receiver):
    key = ir.derive("checkout.charge", ["order_17"])
    receiver.inject("reset_after_commit", key=key, attempt=1)
    client = stripe_client(receiver)
    with ir.idempotency_key(key):
        charge = client.v1.charges.create(params={"amount": 500, "currency": "eur"})
    assert charge["effect"] == 1
    assert receiver.keys() == [key, key]
    assert receiver.effects_for(key) == 1
