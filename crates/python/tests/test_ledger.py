"""The ledger across processes and languages: a Python process and a Rust process (idemcurl)
on one SQLite file, a Rust worker and a Python worker racing on one key, a run that meets a live
run past its lease_wait, and a Python process killed with SIGKILL mid-flight, then restarted."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST, idemcurl

BODY = b'{"amount":500}'
HEADERS = {"Content-Type": "application/json"}
SCOPE = "charges"


def python_charge(receiver, ledger, key, **options):
    transport = ir.Transport(**{"ledger": str(ledger), "ledger_scope": SCOPE, **FAST, **options})
    try:
        with httpx.Client(transport=transport) as client:
            return client.post(
                receiver.url("/v1/charges"),
                content=BODY,
                headers={**HEADERS, "Idempotency-Key": key},
            )
    finally:
        transport.close()


def idemcurl_binary():
    binary = idemcurl()
    if binary is None:
        pytest.fail("idemcurl is not built: `cargo build -p idempotent-retry-curl`, or set IDEMCURL")
    return binary


def ledger_row(ledger, key):
    """The ledger's row for `key`, as `idemcurl ledger show --json` prints it."""
    shown = subprocess.run(
        [idemcurl_binary(), "ledger", "--sqlite", str(ledger), "show", key, "--json"],
        capture_output=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr.decode()
    return json.loads(shown.stdout)


def rfc3339(text):
    """A time `idemcurl ledger show --json` printed, as seconds since the epoch."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def rust_charge(receiver, ledger, key, *extra):
    binary = idemcurl_binary()
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


def test_a_run_that_meets_no_other_run_reports_no_wait_and_a_recorded_answer(receiver, tmp_path):
    response = python_charge(receiver, tmp_path / "ledger.sqlite3", "k-alone")
    report = response.extensions["idempotent_retry"]
    assert response.status_code == 200
    assert report.lease_wait == datetime.timedelta(0)
    assert report.unrecorded is None
    assert report.attempts == 1


#: A worker process on the ledger with the transport's default lease and lease wait: it prints
#: its report, and when it started and got its answer (time.monotonic(), which every process
#: of the machine reads from one clock).
WORKER = textwrap.dedent(
    """
    import json, sys, time
    import httpx
    import idempotent_retry as ir

    ledger, url, key = sys.argv[1:4]
    transport = ir.Transport(ledger=ledger)
    with httpx.Client(transport=transport) as client:
        started_at, started_wall = time.monotonic(), time.time()
        response = client.post(
            url,
            content=b'{"amount":500}',
            headers={"Content-Type": "application/json", "Idempotency-Key": key},
        )
        answered_at = time.monotonic()
    report = response.extensions["idempotent_retry"]
    print(json.dumps({"status": response.status_code, "attempts": report.attempts,
                      "replayed": report.replayed, "body": response.text,
                      "lease_wait": report.lease_wait.total_seconds(),
                      "elapsed": report.elapsed.total_seconds(),
                      "unrecorded": report.unrecorded, "started_at": started_at,
                      "started_wall": started_wall, "answered_at": answered_at}))
    transport.close()
    """
)


def start_worker(receiver, ledger, key):
    """A worker process sending `key`, once its request has reached the receiver."""
    args = [sys.executable, "-c", WORKER, str(ledger), receiver.url("/v1/charges"), key]
    worker = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert receiver.wait_for_arrivals(1, 30) == 1
    except BaseException:
        worker.kill()
        worker.wait(10)
        raise
    return args, worker


def kill(worker):
    """Kills `worker` with SIGKILL; returns when it died (time.monotonic())."""
    try:
        os.kill(worker.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == -signal.SIGKILL
    return killed_at


def test_a_run_that_meets_a_live_run_past_its_lease_wait_is_told_to_pass_a_longer_one(
    receiver, tmp_path
):
    ledger = tmp_path / "ledger.sqlite3"
    key = ir.derive("test.held", ["order-1"])
    # The worker's charge commits, then its answer is held back: while the worker lives, it
    # renews its lease, so every other run meets a live lease.
    receiver.inject("stall_after_commit", key=key, attempt=1, seconds=30)
    _, worker = start_worker(receiver, ledger, key)
    try:
        with pytest.raises(ir.LeaseHeldError) as waited:
            python_charge(receiver, ledger, key, ledger_scope=None, lease_wait=0.2)
        with pytest.raises(ir.LeaseHeldError) as at_once:
            python_charge(receiver, ledger, key, ledger_scope=None, lease_wait=0)
    finally:
        kill(worker)
    message = str(waited.value)
    assert message.endswith("; pass lease_wait=SECONDS to the transport to wait longer for it")
    assert "nothing was sent" in message and key in message
    assert "LedgerOptions" not in message, message
    assert waited.value.lease_wait >= datetime.timedelta(seconds=0.2)
    assert waited.value.elapsed >= waited.value.lease_wait
    assert waited.value.attempts == 0
    assert str(at_once.value).endswith(
        "; pass lease_wait=SECONDS to the transport to wait for it"
    )
    assert "LedgerOptions" not in str(at_once.value)
    assert at_once.value.lease_wait == datetime.timedelta(0)
    assert receiver.arrivals() == 1


def test_a_python_process_killed_mid_flight_then_restarted_charges_once(receiver, tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    key = ir.derive("test.kill", ["order-1"])
    # The first delivery commits the charge, then holds the answer: the process dies waiting.
    receiver.inject("stall_after_commit", key=key, attempt=1, seconds=30)
    args, first = start_worker(receiver, ledger, key)
    killed_at = kill(first)
    assert receiver.effects_for(key) == 1
    dead = ledger_row(ledger, key)
    assert dead["status"] == "in_flight"
    assert dead["lease_expires_at"] is not None

    # The restarted process, with the default options, finds the dead run's lease, waits for
    # it to lapse (at most one lease, 10 s, from the dead run's last renewal), takes the
    # operation over under the same key, and gets the receiver's saved answer.
    again = subprocess.run(args, capture_output=True, timeout=240)
    assert again.returncode == 0, again.stderr.decode()
    assert again.stderr == b"", again.stderr.decode()
    result = json.loads(again.stdout)
    after_kill = result["answered_at"] - killed_at
    print(
        f"\nkill to answer: {after_kill:.2f}s, of which {result['lease_wait']:.2f}s waiting for "
        f"the dead run's lease"
    )
    assert after_kill < 60, "a dead run's key is taken over within one lease (10 s)"
    assert result["status"] == 200
    assert json.loads(result["body"]) == {"effect": 1}
    assert result["attempts"] == 1
    assert result["replayed"] is False
    assert result["unrecorded"] is None
    assert result["elapsed"] >= result["lease_wait"]
    if result["started_wall"] < rfc3339(dead["lease_expires_at"]) - 1:
        # It started while the dead run's lease had a second or more to go: it waited.
        assert result["lease_wait"] > 0, result
    assert receiver.keys() == [key, key]
    assert receiver.effects_for(key) == 1
    # The ledger counts both requests that may have reached the receiver: the dead run's and
    # the restarted one's.
    row = ledger_row(ledger, key)
    assert row["status"] == "succeeded", row
    assert row["attempts"] == 2, row
    assert row["lease_owner"] is None, row
