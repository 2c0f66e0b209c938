"""Fixtures of the package's suite: the workspace's test receiver (the native module's
`_testing` submodule, built with the crate's `testing` feature) and quick retry settings."""

from __future__ import annotations

import os
import shutil
import socket
import threading
from pathlib import Path
from typing import Callable, Optional

import pytest

from idempotent_retry import _native

_testing = getattr(_native, "_testing", None)

#: Retry settings that keep the suite fast: short backoff, short attempts.
FAST = dict(base_delay=0.01, max_delay=0.05)


def listen(serve: Callable[[socket.socket], None]) -> socket.socket:
    """A loopback listener whose every connection is handed to `serve` on a thread of its
    own, until the listener is closed."""
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener


@pytest.fixture
def receiver():
    if _testing is None:
        pytest.fail(
            "the native module was built without the `testing` feature: "
            "build it with `maturin develop --features testing`"
        )
    return _testing.Receiver()


def idemcurl() -> Optional[str]:
    """The workspace's `idemcurl` binary: $IDEMCURL, or a cargo build of it in the target
    directory, or one on PATH."""
    given = os.environ.get("IDEMCURL")
    if given:
        return given
    root = Path(__file__).resolve().parents[3]
    target = Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
    for profile in ("debug", "release"):
        candidate = target / profile / "idemcurl"
        if candidate.exists():
            return str(candidate)
    return shutil.which("idemcurl")
