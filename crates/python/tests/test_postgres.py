"""The PostgreSQL ledger (`ledger="postgresql://..."`): two transports, as two workers of a
fleet, on one table. The server is $IDEMPOTENT_RETRY_PG_URL (.ci/run starts one); without it
the test is skipped, except under CI, where it fails."""

from __future__ import annotations

import os
import uuid

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST

URL = os.environ.get("IDEMPOTENT_RETRY_PG_URL")


@pytest.fixture
def postgres_url():
    if URL:
        return URL
    if os.environ.get("CI"):
        pytest.fail("IDEMPOTENT_RETRY_PG_URL is not set: CI must start PostgreSQL (.ci/postgres.sh)")
    pytest.skip("IDEMPOTENT_RETRY_PG_URL is not set")


def test_a_second_worker_is_answered_from_the_postgres_ledger(receiver, postgres_url):
    key = f"k-pg-{uuid.uuid4()}"
    answers = []
    for worker in ("worker-a", "worker-b"):
        transport = ir.Transport(ledger=postgres_url, worker=worker, **FAST)
        with httpx.Client(transport=transport) as client:
            answers.append(
                client.post(
                    receiver.url("/v1/charges"), content=b"x", headers={"Idempotency-Key": key}
                )
            )
    first, second = answers
    assert first.status_code == second.status_code == 200
    assert first.extensions["idempotent_retry"].replayed is False
    assert second.extensions["idempotent_retry"].replayed is True
    assert second.content == first.content
    assert receiver.arrivals() == 1


def test_an_unreachable_postgres_ledger_is_refused():
    with pytest.raises(RuntimeError, match="PostgreSQL"):
        ir.Transport(ledger="postgresql://postgres@127.0.0.1:1/postgres")
