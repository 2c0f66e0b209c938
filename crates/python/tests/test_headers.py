"""Header fields sent more than once, both ways: per RFC 9110 §5.3 the order of one field
name's values is significant, the interleaving of different names is not. A raw socket
server shows what is on the wire and sends an interleaved response head."""

from __future__ import annotations

import asyncio
import socket
from typing import Iterator, List, Tuple

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST, listen

#: The response head's fields, interleaved: two `Set-Cookie`, and `a` around `b`.
RESPONSE_FIELDS = [
    ("Set-Cookie", "first=1; Path=/"),
    ("A", "1"),
    ("B", "2"),
    ("Set-Cookie", "second=2; Path=/"),
    ("A", "3"),
]

#: The request's fields, interleaved the same way.
REQUEST_FIELDS = [
    ("a", "1"),
    ("b", "2"),
    ("a", "3"),
    ("x-tag", "one"),
    ("b", "4"),
    ("x-tag", "two"),
]


class RawServer:
    """Answers each request with the next of `statuses` (the last one repeated) and
    `RESPONSE_FIELDS`; keeps each request head's fields as they came, in order."""

    def __init__(self, statuses: List[int]) -> None:
        self.statuses = statuses
        self.heads: List[List[Tuple[str, str]]] = []
        self.listener = listen(self._serve)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1/thing"

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                fields = []
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, value = line.split(":", 1)
                    fields.append((name.strip().lower(), value.strip()))
                length = int(dict(fields).get("content-length", "0"))
                while len(buffer) < length:
                    buffer += connection.recv(65536)
                buffer = buffer[length:]
                self.heads.append(fields)
                status = self.statuses[min(len(self.heads), len(self.statuses)) - 1]
                lines = [f"HTTP/1.1 {status} Whatever"]
                lines += [f"{name}: {value}" for name, value in RESPONSE_FIELDS]
                lines += ["Content-Length: 2", "", ""]
                connection.sendall("\r\n".join(lines).encode() + b"ok")

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def server() -> Iterator[RawServer]:
    running = RawServer([503, 200])
    yield running
    running.close()


def values(fields: List[Tuple[str, str]], name: str) -> List[str]:
    return [value for field, value in fields if field == name]


def check_wire(server: RawServer) -> None:
    # Both attempts (503, then 200) carried every value of each name, in its order.
    assert len(server.heads) == 2
    for head in server.heads:
        assert values(head, "a") == ["1", "3"]
        assert values(head, "b") == ["2", "4"]
        assert values(head, "x-tag") == ["one", "two"]


def check_response(response: httpx.Response) -> None:
    assert response.status_code == 200
    assert response.extensions["idempotent_retry"].attempts == 2
    assert response.headers.get_list("set-cookie") == ["first=1; Path=/", "second=2; Path=/"]
    assert response.headers.get_list("a") == ["1", "3"]
    assert response.headers["a"] == "1, 3"
    items = response.headers.multi_items()
    assert [value for name, value in items if name == "a"] == ["1", "3"]
    assert [value for name, value in items if name == "b"] == ["2"]
    assert sorted(response.cookies.keys()) == ["first", "second"]


def test_repeated_names_keep_their_order_on_the_wire_and_in_the_response(server):
    with httpx.Client(transport=ir.Transport(**FAST)) as c:
        response = c.post(server.url, content=b"{}", headers=REQUEST_FIELDS)
    check_response(response)
    check_wire(server)


def test_the_async_transport_keeps_them_too(server):
    async def main() -> httpx.Response:
        async with httpx.AsyncClient(transport=ir.AsyncTransport(**FAST)) as c:
            return await c.post(server.url, content=b"{}", headers=REQUEST_FIELDS)

    check_response(asyncio.run(main()))
    check_wire(server)
