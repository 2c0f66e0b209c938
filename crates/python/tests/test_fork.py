"""A child made by fork(): the parent's transport refuses to run there (its runtime's threads
stayed in the parent) instead of waiting for ever, a transport made in the child works, and
the child's end leaves the parent's connections as they were."""

from __future__ import annotations

import gc
import json
import os
import signal
import time

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST
from test_streaming import Streaming

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here")

#: How long the parent waits for the child before killing it.
CHILD_LIMIT = 30.0


def charge(c: httpx.Client, receiver, key: str) -> httpx.Response:
    return c.post(
        receiver.url("/v1/charges"), json={"amount": 1}, headers={"Idempotency-Key": key}
    )


def in_child(body) -> dict:
    """Runs `body()` in a forked child and returns the dict it gave, within CHILD_LIMIT."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        code = 1
        try:
            os.write(write, json.dumps(body()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    deadline = time.monotonic() + CHILD_LIMIT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the child did not end within {CHILD_LIMIT} s")
        time.sleep(0.02)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, said)
    return json.loads(said)


def test_the_parent_s_transport_refuses_in_a_child_and_a_new_one_sends(receiver):
    parent = httpx.Client(transport=ir.Transport(**FAST))
    # The runtime runs and a pooled connection is open before the fork.
    assert charge(parent, receiver, "k-fork-before").status_code == 200

    def child() -> dict:
        try:
            charge(parent, receiver, "k-fork-old")
            old = "sent"
        except RuntimeError as err:
            old = str(err)
        with httpx.Client(transport=ir.Transport(**FAST)) as fresh:
            new = charge(fresh, receiver, "k-fork-new")
        return {"old": old, "status": new.status_code}

    said = in_child(child)
    assert "a child of a fork()" in said["old"], said
    assert "Make a new transport after forking" in said["old"], said
    assert str(os.getpid()) in said["old"]
    assert said["status"] == 200
    assert receiver.effects_for("k-fork-old") == 0
    assert receiver.effects_for("k-fork-new") == 1
    # The parent's transport and its kept connection still work.
    assert charge(parent, receiver, "k-fork-after").status_code == 200
    parent.close()


def test_a_child_that_drops_the_parent_s_transport_leaves_the_parent_s_connection_alone(
    receiver,
):
    transport = ir.Transport(**FAST)
    parent = httpx.Client(transport=transport)
    assert charge(parent, receiver, "k-drop-before").status_code == 200

    def child() -> dict:
        nonlocal parent, transport
        parent.close()  # the transport's close: a no-op for the parent's objects here
        del parent, transport
        gc.collect()
        return {"dropped": True}

    assert in_child(child) == {"dropped": True}
    # Sent on the connection kept from before the fork: the child's drop did not take it out
    # of the parent's event queue (a request on it would then never see its answer).
    started = time.monotonic()
    assert charge(parent, receiver, "k-drop-after").status_code == 200
    assert time.monotonic() - started < 10
    parent.close()


def test_a_body_still_streaming_at_a_fork_refuses_in_the_child_and_reads_on_in_the_parent():
    server = Streaming()
    try:
        client = httpx.Client(transport=ir.Transport(**FAST))
        with client.stream("GET", server.url("/events")) as response:
            chunks = response.iter_raw()
            assert next(chunks) == b"data: first\n\n"

            def child() -> dict:
                try:
                    return {"read": repr(next(chunks))}
                except RuntimeError as err:
                    return {"read": str(err)}

            said = in_child(child)
            assert "this response's body was made in process" in said["read"], said
            server.go.set()
            assert b"".join(chunks) == b"data: second\n\n"
    finally:
        server.close()
