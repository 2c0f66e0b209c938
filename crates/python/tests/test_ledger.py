"""The ledger across processes and languages: a Python process and a Rust process (idemcurl)
on one SQLite file, a Rust worker and a Python worker racing on one key, and a Python process
killed with SIGKILL mid-flight, then restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST, idemcurl

BODY = b'{"amount":500}'
HEADERS = {"Content-Type": "application/json"}
SCOPE = "charges"


def python_charge(receiver, ledger, key, **options):
    transport = ir.Transport(ledger=str(ledger), ledger_scope=SCOPE, **{**FAST, **options})
    try:
        with httpx.Client(transport=transport) as client:
            return client.post(
                receiver.url("/v1/charges"),
                content=BODY,
                headers={**HEADERS, "Idempotency-Key": key},
            )
    finally:
        transport.close()


def rust_charge(receiver, ledger, key, *extra):
    binary = idemcurl()
    if binary is None:
        pytest.fail("idemcurl is not built: `cargo build -p idempotent-retry-curl`, or set IDEMCURL")
    done = subprocess.run(
        [
            binary,
            "--silent",
            "--report",
            "json",
            "--ledger",
            str(ledger),
            "--scope",
            SCOPE,
            "--key",
            key,
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            BODY.decode(),
            *extra,
            receiver.url("/v1/charges"),
        ],
        capture_output=True,
        timeout=60,
    )
    report = json.loads(done.stderr.decode().strip().splitlines()[-1])
    return done.returncode, done.stdout, report


def test_a_second_python_process_is_answered_from_the_ledger(receiver, tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    first = python_charge(receiver, ledger, "k-py-py")
    second = python_charge(receiver, ledger, "k-py-py")
    assert first.status_code == second.status_code == 200
    assert second.content == first.content
    assert first.extensions["idempotent_retry"].replayed is False
    assert second.extensions["idempotent_retry"].replayed is True
    assert second.extensions["idempotent_retry"].attempts == 0
    assert receiver.arrivals() == 1


def test_a_key_reused_for_another_request_is_refused(receiver, tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    python_charge(receiver, ledger, "k-reuse")
    transport = ir.Transport(ledger=str(ledger), ledger_scope=SCOPE, **FAST)
    with pytest.raises(ir.KeyReuseError) as raised:
        httpx.Client(transport=transport).post(
            receiver.url("/v1/charges"),
            content=b'{"amount":999}',
            headers={"Idempotency-Key": "k-reuse"},
        )
    transport.close()
    assert raised.value.outcome == "done"
    assert raised.value.key == "k-reuse"
    assert receiver.arrivals() == 1


def test_rust_sends_then_python_replays(receiver, tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    code, out, report = rust_charge(receiver, ledger, "k-rs-py")
    assert code == 0, report
    assert report["sent"] is True and report["replayed"] is False
    response = python_charge(receiver, ledger, "k-rs-py")
    assert response.status_code == 200
    assert response.content == out
    assert response.extensions["idempotent_retry"].replayed is True
    assert receiver.arrivals() == 1
    assert receiver.effects_for("k-rs-py") == 1


def test_python_sends_then_rust_replays(receiver, tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    response = python_charge(receiver, ledger, "k-py-rs")
    code, out, report = rust_charge(receiver, ledger, "k-py-rs")
    assert code == 0, report
    assert report["replayed"] is True
    assert out == response.content
    assert receiver.arrivals() == 1


def test_a_rust_worker_and_a_python_worker_racing_on_one_key_send_once(receiver, tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    # Whoever claims the key first holds it for 0.5 s; the other waits for its lease.
    receiver.inject("slow_handler", key="k-race", attempt=1, seconds=0.5)
    results = {}

    def rust():
        results["rust"] = rust_charge(receiver, ledger, "k-race", "--lease-wait", "20s")

    thread = threading.Thread(target=rust)
    thread.start()
    results["python"] = python_charge(receiver, ledger, "k-race", lease_wait=20)
    thread.join(60)
    code, out, report = results["rust"]
    assert code == 0, report
    assert results["python"].status_code == 200
    assert out == results["python"].content
    assert receiver.arrivals() == 1
    assert receiver.effects_for("k-race") == 1
    # Exactly one of them sent it; the other was answered from the ledger.
    assert [report["replayed"], results["python"].extensions["idempotent_retry"].replayed].count(
        True
    ) == 1


WORKER = textwrap.dedent(
    """
    import json, sys
    import httpx
    import idempotent_retry as ir

    ledger, url, key = sys.argv[1:4]
    transport = ir.Transport(
        ledger=ledger, lease_slack=0.2, lease_wait=30, base_delay=0.01, max_delay=0.05
    )
    with httpx.Client(transport=transport, timeout=2.0) as client:
        response = client.post(
            url, content=b'{"amount":500}', headers={"Idempotency-Key": key}
        )
    report = response.extensions["idempotent_retry"]
    print(json.dumps({"status": response.status_code, "attempts": report.attempts,
                      "replayed": report.replayed, "body": response.text}))
    transport.close()
    """
)


def test_a_python_process_killed_mid_flight_then_restarted_charges_once(receiver, tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    key = ir.derive("test.kill", ["order-1"])
    # The first delivery commits the charge, then holds the answer: the process dies waiting.
    receiver.inject("stall_after_commit", key=key, attempt=1, seconds=30)
    args = [sys.executable, "-c", WORKER, str(ledger), receiver.url("/v1/charges"), key]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert receiver.wait_for_arrivals(1, 30) == 1
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == -signal.SIGKILL
    assert receiver.effects_for(key) == 1

    # The restarted process finds the dead run's row, waits for its lease to lapse, takes the
    # operation over under the same key, and gets the receiver's saved answer.
    again = subprocess.run(args, capture_output=True, timeout=60)
    assert again.returncode == 0, again.stderr.decode()
    result = json.loads(again.stdout)
    assert result["status"] == 200
    assert json.loads(result["body"]) == {"effect": 1}
    assert receiver.keys() == [key, key]
    assert receiver.effects_for(key) == 1
