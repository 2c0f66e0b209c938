"""The transports' options: validated when the transport is made, and the attempt timeout
taken from httpx's timeout or, without one, from the policy."""

from __future__ import annotations

import time

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"base_delay": 2, "max_delay": 1},
        {"attempt_timeout": -1},
        {"lease": -1},
        {"lease_wait": -1},
        {"key_header": "not a header"},
        {"answer_read_limit": -1},
        {"max_saved_body": -1},
        {"max_in_progress_wait": -1},
    ],
)
def test_invalid_options_are_refused(options):
    with pytest.raises(ValueError):
        ir.Transport(**options)
    with pytest.raises(ValueError):
        ir.AsyncTransport(**options)


def test_a_ledger_that_cannot_be_opened_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="ledger"):
        ir.Transport(ledger=tmp_path / "missing-dir" / "sub" / "ledger.sqlite3")


def test_a_ledger_path_may_be_a_path_object(receiver, tmp_path):
    transport = ir.Transport(ledger=tmp_path / "ledger.sqlite3", **FAST)
    with httpx.Client(transport=transport) as client:
        client.post(receiver.url("/v1/c"), content=b"x", headers={"Idempotency-Key": "k-p"})
        again = client.post(receiver.url("/v1/c"), content=b"x", headers={"Idempotency-Key": "k-p"})
    assert again.extensions["idempotent_retry"].replayed is True
    assert (tmp_path / "ledger.sqlite3").exists()


def test_without_an_httpx_timeout_the_policy_attempt_timeout_applies(receiver):
    receiver.inject("stall_after_commit", key="k-t", attempt=1, seconds=5)
    transport = ir.Transport(max_attempts=1, attempt_timeout=0.3, **FAST)
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout) as raised:
        httpx.Client(transport=transport, timeout=None).post(
            receiver.url("/v1/c"), content=b"x", headers={"Idempotency-Key": "k-t"}
        )
    assert time.monotonic() - started < 2
    assert raised.value.attempts == 1
    assert raised.value.kind == "attempts_exhausted"
    assert raised.value.outcome == "unknown"


def test_a_drained_retry_budget_stops_the_retries(receiver):
    for attempt in (1, 2, 3):
        receiver.inject("status", key="k-budget", attempt=attempt, status=503)
    # Room for one failed retry: the second is refused.
    transport = ir.Transport(max_attempts=5, budget_capacity=10, budget_retry_cost=10, **FAST)
    with pytest.raises(ir.HTTPStatusError) as raised:
        httpx.Client(transport=transport).post(
            receiver.url("/v1/c"), content=b"x", headers={"Idempotency-Key": "k-budget"}
        )
    assert raised.value.response.status_code == 503
    assert raised.value.kind == "budget_exhausted"
    assert raised.value.attempts == 2
    # The advice names the transport's keyword, not the Rust crate's.
    assert "budget_capacity=" in str(raised.value)
    assert "RetryBudgetConfig" not in str(raised.value)
    assert receiver.keys() == ["k-budget"] * 2


def test_without_a_retry_budget_every_attempt_is_made(receiver):
    for attempt in (1, 2, 3):
        receiver.inject("status", key="k-nobudget", attempt=attempt, status=503)
    transport = ir.Transport(max_attempts=4, retry_budget=False, budget_capacity=10, **FAST)
    response = httpx.Client(transport=transport).post(
        receiver.url("/v1/c"), content=b"x", headers={"Idempotency-Key": "k-nobudget"}
    )
    assert response.status_code == 200
    assert response.extensions["idempotent_retry"].attempts == 4
