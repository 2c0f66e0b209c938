"""TLS and proxies: httpx gives a custom transport none of the client's `verify=`, `cert=` or
`proxy=`, so the transports take them. An HTTPS server (Python's `ssl`) with a certificate
signed by a private authority made with the `openssl` command; a small forwarding proxy."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Iterator, List

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST, listen

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None and not os.environ.get("CI"),
    reason="the openssl command is not installed",
)


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A private CA, a server certificate for 127.0.0.1 and a client certificate it signed."""
    d = tmp_path_factory.mktemp("pki")
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", "/CN=Test CA", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
    )  # fmt: skip
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
    )
    (d / "client.ext").write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}-one",
            "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"),
        )  # fmt: skip
        openssl(
            "x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
            "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
            "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.pem"),
        )  # fmt: skip
    (d / "client-both.pem").write_text(
        (d / "client.pem").read_text() + (d / "client.key").read_text()
    )
    (d / "not-pem.txt").write_text("this is not a certificate\n")
    (d / "bad-block.pem").write_text(
        "-----BEGIN CERTIFICATE-----\nMIIBbad0000\n-----END CERTIFICATE-----\n"
    )
    return d


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        peer = self.connection.getpeercert()  # type: ignore[attr-defined]
        subject = None
        if peer:
            subject = dict(item[0] for item in peer["subject"]).get("commonName")
        body = json.dumps({"client": subject}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def serve_tls(pki: Path, require_client_cert: bool = False) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(pki / "ca.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/v1/thing"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def https(pki) -> Iterator[str]:
    yield from serve_tls(pki)


@pytest.fixture
def mtls(pki) -> Iterator[str]:
    yield from serve_tls(pki, require_client_cert=True)


def get(url: str, **options):
    with httpx.Client(transport=ir.Transport(**{**FAST, "max_attempts": 2, **options})) as c:
        return c.get(url)


def test_a_private_authority_is_not_trusted_by_default(https):
    with pytest.raises(httpx.ConnectError) as caught:
        get(https)
    assert isinstance(caught.value, ir.ConnectError)
    assert caught.value.outcome == "not_done"
    assert "certificate" in str(caught.value).lower()


def test_verify_a_ca_file_trusts_its_roots(https, pki):
    response = get(https, verify=str(pki / "ca.pem"))
    assert response.status_code == 200
    assert response.json() == {"client": None}
    # A path object too.
    assert get(https, verify=pki / "ca.pem").status_code == 200


def test_verify_a_ca_file_trusts_only_its_roots(https, pki):
    # The server's own certificate is not a CA: a bundle of it alone vouches for nothing.
    with pytest.raises(ir.ConnectError) as caught:
        get(https, verify=pki / "client.pem")
    assert caught.value.outcome == "not_done"


def test_verify_false_checks_no_certificate(https):
    response = get(https, verify=False)
    assert response.status_code == 200


def test_the_async_transport_takes_verify_too(https, pki):
    async def main() -> int:
        transport = ir.AsyncTransport(**FAST, verify=pki / "ca.pem")
        async with httpx.AsyncClient(transport=transport) as c:
            return (await c.get(https)).status_code

    assert asyncio.run(main()) == 200


def test_the_httpx2_transport_takes_verify_too(https, pki):
    httpx2 = pytest.importorskip("httpx2")
    from idempotent_retry.httpx2 import Transport

    with httpx2.Client(transport=Transport(**FAST, verify=pki / "ca.pem")) as c:
        assert c.get(https).status_code == 200


def test_a_missing_ca_file_is_a_clear_error(tmp_path):
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(FileNotFoundError) as caught:
        ir.Transport(verify=missing)
    assert str(missing) in str(caught.value)
    assert "PEM" in str(caught.value)


def test_a_ca_file_without_a_certificate_is_a_clear_error(pki):
    with pytest.raises(ValueError) as caught:
        ir.Transport(verify=pki / "not-pem.txt")
    assert "not-pem.txt" in str(caught.value)
    assert "BEGIN CERTIFICATE" in str(caught.value)


def test_a_ca_file_with_a_broken_certificate_is_a_clear_error(pki):
    with pytest.raises(ValueError) as caught:
        ir.Transport(verify=pki / "bad-block.pem")
    assert "bad-block.pem" in str(caught.value)
    assert "valid PEM CA certificates" in str(caught.value)


def test_an_ssl_context_is_refused_with_what_to_pass_instead():
    with pytest.raises(TypeError) as caught:
        ir.Transport(verify=ssl.create_default_context())
    assert "SSLContext" in str(caught.value)
    assert 'verify="/path/to/ca.pem"' in str(caught.value)


def test_a_client_certificate_is_presented(mtls, pki):
    ca = pki / "ca.pem"
    pair = get(mtls, verify=ca, cert=(pki / "client.pem", pki / "client.key"))
    assert pair.status_code == 200
    assert pair.json() == {"client": "client-one"}
    one_file = get(mtls, verify=ca, cert=str(pki / "client-both.pem"))
    assert one_file.json() == {"client": "client-one"}


def test_without_the_client_certificate_the_server_refuses(mtls, pki):
    with pytest.raises(httpx.TransportError):
        get(mtls, verify=pki / "ca.pem")


def test_a_client_certificate_without_its_key_is_a_clear_error(pki):
    with pytest.raises(ValueError) as caught:
        ir.Transport(cert=pki / "client.pem")
    assert "client.pem" in str(caught.value)
    assert "key" in str(caught.value)
    with pytest.raises(FileNotFoundError) as missing:
        ir.Transport(cert=(pki / "client.pem", pki / "gone.key"))
    assert "gone.key" in str(missing.value)
    with pytest.raises(ValueError) as mismatch:
        ir.Transport(cert=(pki / "client.pem", pki / "server.key"))
    assert "client.pem" in str(mismatch.value) and "server.key" in str(mismatch.value)
    assert "its own private key" in str(mismatch.value)
    with pytest.raises(ValueError, match="encrypted"):
        ir.Transport(cert=(pki / "client.pem", pki / "client.key", "secret"))


class Proxy:
    """A forwarding proxy: an absolute-form request is passed on to its host, a CONNECT is
    tunnelled; each request line it saw is kept."""

    def __init__(self) -> None:
        self.seen: List[str] = []
        self.authorizations: List[str] = []
        self.listener = listen(self._serve)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(65536)
            if not chunk:
                client.close()
                return
            head += chunk
        lines = head.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
        line = lines[0]
        self.seen.append(line)
        for field in lines[1:]:
            name, value = field.split(":", 1)
            if name.strip().lower() == "proxy-authorization":
                self.authorizations.append(value.strip())
        method, target, _ = line.split(" ", 2)
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)))
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            rest = head.split(b"\r\n\r\n", 1)[1]
        else:
            authority = httpx.URL(target)
            upstream = socket.create_connection((authority.host, authority.port or 80))
            rest = head
        if rest:
            upstream.sendall(rest)
        threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()
        self._pipe(client, upstream)

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                chunk = source.recv(65536)
                if not chunk:
                    break
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    running = Proxy()
    yield running
    running.close()


def test_plain_http_goes_through_the_proxy(receiver, proxy):
    url = receiver.url("/v1/charges")
    with httpx.Client(transport=ir.Transport(**FAST, proxy=proxy.url)) as c:
        response = c.post(url, json={"amount": 1}, headers={"Idempotency-Key": "k-proxy"})
    assert response.status_code == 200
    assert proxy.seen == [f"POST {url} HTTP/1.1"]
    assert receiver.keys() == ["k-proxy"]


def test_https_is_tunnelled_through_the_proxy(https, pki, proxy):
    response = get(https, verify=pki / "ca.pem", proxy=proxy.url)
    assert response.status_code == 200
    authority = httpx.URL(https)
    assert proxy.seen == [f"CONNECT {authority.host}:{authority.port} HTTP/1.1"]


@pytest.mark.parametrize("url", ["not a url", "socks5://127.0.0.1:1080", "ftp://proxy:21"])
def test_a_proxy_url_this_build_cannot_use_is_a_clear_error(url):
    with pytest.raises(ValueError) as caught:
        ir.Transport(proxy=url)
    assert url in str(caught.value)
    assert "http://" in str(caught.value)


def test_a_proxy_credential_is_sent_to_the_proxy(receiver, proxy):
    url = receiver.url("/v1/charges")
    authority = proxy.url.split("://", 1)[1]
    with httpx.Client(transport=ir.Transport(**FAST, proxy=f"http://me:s3cret@{authority}")) as c:
        response = c.post(url, json={"amount": 1}, headers={"Idempotency-Key": "k-auth"})
    assert response.status_code == 200
    assert proxy.authorizations == ["Basic bWU6czNjcmV0"]
