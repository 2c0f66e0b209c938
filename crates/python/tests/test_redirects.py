"""Redirects that httpx follows (`follow_redirects=True`) for a keyed POST: one operation, sync
and async, on httpx and httpx2, with and without a ledger. Two loopback servers on different
ports are two origins; each records what it received."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST
from test_ledger import ledger_row

if os.environ.get("CI"):
    import httpx2
else:
    httpx2 = pytest.importorskip("httpx2")

from idempotent_retry import httpx2 as ir2  # noqa: E402

BODY = b'{"amount":1200}'
HEADERS = {"Content-Type": "application/json"}


class Origin:
    """A loopback server: `routes` maps (method, path) to (status, Location or None); any
    other request is the operation's effect, answered 200 with the effect's number. Every
    request is recorded as (method, path, key, body); the body is read by its
    `Content-Length`, so a body sent as a stream (chunked) is recorded empty."""

    def __init__(self, routes: Optional[Dict[Tuple[str, str], Tuple[int, str]]] = None):
        self.routes = routes or {}
        self.seen: List[Tuple[str, str, Optional[str], bytes]] = []
        self.effects = 0
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                origin.seen.append(
                    (self.command, self.path, self.headers.get("Idempotency-Key"), body)
                )
                route = origin.routes.get((self.command, self.path))
                if route is not None:
                    status, location = route
                    self.send_response(status)
                    self.send_header("Location", location.format(**origin.names))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                origin.effects += 1
                answer = json.dumps({"effect": origin.effects, "path": self.path}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = answer

            def log_message(self, *args: Any) -> None:
                pass

        self.names: Dict[str, str] = {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def origins():
    """Origin `a` redirects: `/charge` 308 to `/charge/`, `/move` 307 to `b`'s `/charge/`,
    `/see` 303 to `/result`."""
    b = Origin()
    a = Origin(
        {
            ("POST", "/charge"): (308, "/charge/"),
            ("POST", "/move"): (307, "{b}/charge/"),
            ("POST", "/see"): (303, "/result"),
        }
    )
    a.names["b"] = b.url("")
    yield a, b
    a.close()
    b.close()


#: (httpx module, its transports) for each flavour.
FLAVOURS = [(httpx, ir), (httpx2, ir2)]
FLAVOUR_IDS = ["httpx", "httpx2"]


def post(
    hx: Any, flavour: Any, url: str, key: str, sync: bool, follow: bool = True, **options: Any
) -> Any:
    """One keyed POST through a client of `hx` on the transport of `flavour`, sync or async;
    the transport closed after it."""
    headers = {**HEADERS, "Idempotency-Key": key}
    if sync:
        transport = flavour.Transport(**FAST, **options)
        try:
            with hx.Client(transport=transport, follow_redirects=follow) as client:
                response = client.post(url, content=BODY, headers=headers)
                response.read()
                return response
        finally:
            transport.close()

    async def main() -> Any:
        transport = flavour.AsyncTransport(**FAST, **options)
        try:
            async with hx.AsyncClient(transport=transport, follow_redirects=follow) as client:
                response = await client.post(url, content=BODY, headers=headers)
                await response.aread()
                return response
        finally:
            await transport.aclose()

    return asyncio.run(main())


def report(response: Any) -> ir.Report:
    found: ir.Report = response.extensions[ir.REPORT_EXTENSION]
    return found


@pytest.mark.parametrize("hx, flavour", FLAVOURS, ids=FLAVOUR_IDS)
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("ledger", [False, True], ids=["plain", "ledger"])
def test_a_same_origin_308_is_one_operation_with_the_key_and_the_body_on_both_hops(
    origins, tmp_path, hx, flavour, sync, ledger
):
    a, b = origins
    options = {"ledger": tmp_path / "ops.sqlite3"} if ledger else {}
    response = post(hx, flavour, a.url("/charge"), "k-308", sync, **options)
    assert response.status_code == 200
    assert response.json() == {"effect": 1, "path": "/charge/"}
    assert str(response.url) == a.url("/charge/")
    assert [hop.status_code for hop in response.history] == [308]
    assert a.seen == [
        ("POST", "/charge", "k-308", BODY),
        ("POST", "/charge/", "k-308", BODY),
    ]
    assert report(response).key == "k-308"
    assert report(response).attempts == 1
    if not ledger:
        return
    # The row is the request as first sent, its answer the final one: a re-run is answered
    # from it, nothing sent.
    row = ledger_row(tmp_path / "ops.sqlite3", "k-308")
    assert row["status"] == "succeeded", row
    assert row["url"] == a.url("/charge"), row
    assert row["response"]["url"] == a.url("/charge/"), row
    again = post(hx, flavour, a.url("/charge"), "k-308", sync, **options)
    assert again.status_code == 200
    assert again.json() == {"effect": 1, "path": "/charge/"}
    assert report(again).replayed
    assert report(again).answered_url == a.url("/charge/")
    assert again.history == []
    assert len(a.seen) == 2
    assert a.effects == 1


@pytest.mark.parametrize("hx, flavour", FLAVOURS, ids=FLAVOUR_IDS)
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("ledger", [False, True], ids=["plain", "ledger"])
def test_a_cross_origin_307_is_followed_without_the_key(
    origins, tmp_path, hx, flavour, sync, ledger
):
    a, b = origins
    options = {"ledger": tmp_path / "ops.sqlite3"} if ledger else {}
    response = post(hx, flavour, a.url("/move"), "k-307", sync, **options)
    assert response.status_code == 200
    assert response.json() == {"effect": 1, "path": "/charge/"}
    assert str(response.url) == b.url("/charge/")
    assert [hop.status_code for hop in response.history] == [307]
    assert a.seen == [("POST", "/move", "k-307", BODY)]
    # The body again, the key kept from the other origin.
    assert b.seen == [("POST", "/charge/", None, BODY)]
    assert report(response).key is None
    if not ledger:
        return
    # The operation's row keeps the 307 and where it pointed, as not done: the first origin
    # ran nothing, and the hop elsewhere went without the key.
    row = ledger_row(tmp_path / "ops.sqlite3", "k-307")
    assert row["status"] == "failed_final", row
    assert row["response"]["status"] == 307, row
    saved = [list(pair) for pair in row["response"]["headers"]]
    assert ["location", b.url("/charge/")] in saved, row
    # The 307 came from the request's own URL.
    assert row["response"]["url"] is None, row


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_allow_key_to_makes_the_cross_origin_hop_part_of_the_operation(origins, tmp_path, sync):
    a, b = origins
    options = {"ledger": tmp_path / "ops.sqlite3", "allow_key_to": [b.url("")]}
    response = post(httpx, ir, a.url("/move"), "k-307-allowed", sync, **options)
    assert response.status_code == 200
    assert b.seen == [("POST", "/charge/", "k-307-allowed", BODY)]
    assert ledger_row(tmp_path / "ops.sqlite3", "k-307-allowed")["status"] == "succeeded"
    again = post(httpx, ir, a.url("/move"), "k-307-allowed", sync, **options)
    assert report(again).replayed
    assert again.json() == {"effect": 1, "path": "/charge/"}
    assert (len(a.seen), len(b.seen)) == (1, 1)


def test_allow_key_to_is_a_list_of_origins():
    with pytest.raises(TypeError, match="not a list of origins"):
        ir.Transport(allow_key_to="https://api-eu.example.com")
    with pytest.raises(ValueError, match="https://api.example.com/v1"):
        ir.Transport(allow_key_to=["https://api.example.com/v1"])


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_without_follow_redirects_the_308_is_the_answer_and_next_request_goes_on(
    origins, tmp_path, sync
):
    a, b = origins
    ledger = tmp_path / "ops.sqlite3"
    response = post(httpx, ir, a.url("/charge"), "k-manual", sync, follow=False, ledger=ledger)
    assert response.status_code == 308
    assert response.next_request is not None
    assert a.seen == [("POST", "/charge", "k-manual", BODY)]
    assert ledger_row(ledger, "k-manual")["status"] == "failed_final"
    # Sent by hand, the hop httpx built is the same operation, recorded under the first URL.
    transport = ir.Transport(ledger=ledger, **FAST)
    with httpx.Client(transport=transport) as client:
        hop = client.send(response.next_request)
    transport.close()
    assert hop.json() == {"effect": 1, "path": "/charge/"}
    assert a.seen[1] == ("POST", "/charge/", "k-manual", BODY)
    assert ledger_row(ledger, "k-manual")["status"] == "succeeded"


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_a_303_is_read_with_a_keyless_get_and_replayed_as_the_303(origins, tmp_path, sync):
    a, b = origins
    ledger = tmp_path / "ops.sqlite3"
    response = post(httpx, ir, a.url("/see"), "k-303", sync, ledger=ledger)
    assert response.status_code == 200
    assert [hop.status_code for hop in response.history] == [303]
    assert a.seen == [("POST", "/see", "k-303", BODY), ("GET", "/result", None, b"")]
    again = post(httpx, ir, a.url("/see"), "k-303", sync, ledger=ledger)
    assert again.status_code == 200
    # The 303 is the operation's answer, replayed; the result is read again.
    assert report(again.history[0]).replayed
    assert a.seen[2:] == [("GET", "/result", None, b"")]


def test_a_key_the_engine_minted_goes_on_to_the_hop(origins):
    a, b = origins
    with httpx.Client(transport=ir.Transport(**FAST), follow_redirects=True) as client:
        response = client.post(a.url("/charge"), content=BODY)
    (_, _, first, _), (_, _, second, _) = a.seen
    assert first and first == second == report(response).key


def test_report_durations_are_timedeltas(origins):
    a, b = origins
    response = post(httpx, ir, a.url("/charge"), "k-durations", True)
    found = report(response)
    for duration in (found.elapsed, found.lease_wait, found.in_progress_wait):
        assert isinstance(duration, datetime.timedelta)
    assert found.elapsed > datetime.timedelta(0)
    assert found.lease_wait == found.in_progress_wait == datetime.timedelta(0)
