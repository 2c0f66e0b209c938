"""Responses without a length (chunked, server-sent events, a body until the connection
closes) are streamed to httpx as they arrive; short ones of known length are read whole."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST


class Streaming:
    """A server whose answer is chunked: `first`, then, once `go` is set, `second` and the
    last chunk (or, with `cut`, a cut connection instead)."""

    def __init__(self, cut: bool = False):
        self.go = threading.Event()
        server = self

        def chunk(data: bytes) -> bytes:
            return b"%x\r\n%s\r\n" % (len(data), data)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(chunk(b"data: first\n\n"))
                self.wfile.flush()
                server.go.wait(10)
                if cut:
                    self.wfile.write(b"40\r\npart of a chunk")
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                self.wfile.write(chunk(b"data: second\n\n") + b"0\r\n\r\n")
                self.wfile.flush()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path):
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self):
        self.go.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def streaming():
    server = Streaming()
    yield server
    server.close()


def test_a_body_of_unknown_length_arrives_as_it_is_sent(streaming):
    client = httpx.Client(transport=ir.Transport(**FAST))
    with client.stream("GET", streaming.url("/events")) as response:
        chunks = response.iter_raw()
        # The first part is here before the server sends the second.
        assert next(chunks) == b"data: first\n\n"
        streaming.go.set()
        assert b"".join(chunks) == b"data: second\n\n"
    assert response.extensions["idempotent_retry"].attempts == 1


def test_an_async_body_of_unknown_length_arrives_as_it_is_sent(streaming):
    async def main():
        async with httpx.AsyncClient(transport=ir.AsyncTransport(**FAST)) as client:
            async with client.stream("GET", streaming.url("/events")) as response:
                chunks = response.aiter_raw()
                first = await chunks.__anext__()
                streaming.go.set()
                rest = b"".join([chunk async for chunk in chunks])
                return first, rest

    first, rest = asyncio.run(main())
    assert first == b"data: first\n\n"
    assert rest == b"data: second\n\n"


def test_a_streamed_body_cut_off_raises_read_error_outcome_done():
    server = Streaming(cut=True)
    try:
        client = httpx.Client(transport=ir.Transport(**FAST))
        with client.stream("GET", server.url("/events")) as response:
            chunks = response.iter_raw()
            assert next(chunks) == b"data: first\n\n"
            server.go.set()
            with pytest.raises(httpx.ReadError) as raised:
                b"".join(chunks)
    finally:
        server.close()
    assert isinstance(raised.value, ir.OperationError)
    # The answer's head arrived: the operation is done, its body lost.
    assert raised.value.outcome == "done"
    assert "cut off" in str(raised.value)
    # The response's report: the one attempt whose head arrived.
    assert raised.value.attempts == 1
    assert [(a.number, a.status) for a in raised.value.history] == [(1, 200)]


def test_a_known_short_body_is_read_whole(receiver):
    response = httpx.Client(transport=ir.Transport(**FAST)).post(
        receiver.url("/v1/charges"), content=b"x", headers={"Idempotency-Key": "k-whole"}
    )
    assert response.json() == {"effect": 1}
