"""Secrets at rest: a ledger row's URL keeps no query value (``?api_key=…``), and with
``seal_keys=`` the saved answer is encrypted in the file yet replayed byte for byte; a key
that does not open it raises ``LedgerError`` naming the key id, nothing sent."""

from __future__ import annotations

import sqlite3

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST

OLD = "k1:" + "11" * 32
NEW = "k2:" + "22" * 32


def charge(ledger, receiver, key, **options):
    transport = ir.Transport(ledger=str(ledger), **{**FAST, **options})
    try:
        with httpx.Client(transport=transport) as client:
            return client.post(
                receiver.url("/v1/charges?api_key=QUERYSECRET9&page=2"),
                json={"amount": 500, "card": "BODYSECRET"},
                headers={"Idempotency-Key": key, "Authorization": "Bearer BEARERSECRET"},
            )
    finally:
        transport.close()


def stored(ledger) -> bytes:
    data = ledger.read_bytes()
    wal = ledger.with_name(ledger.name + "-wal")
    return data + (wal.read_bytes() if wal.exists() else b"")


def test_the_row_url_is_redacted_and_a_sealed_answer_replays_whole(receiver, tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    first = charge(ledger, receiver, "k-sealed", seal_keys=[OLD])
    again = charge(ledger, receiver, "k-sealed", seal_keys=[NEW, OLD])
    assert again.extensions["idempotent_retry"].replayed is True
    assert (again.status_code, again.content) == (first.status_code, first.content)
    assert again.headers["content-type"] == first.headers["content-type"]
    assert receiver.effects_for("k-sealed") == 1

    with sqlite3.connect(ledger) as db:
        url, key_id = db.execute(
            "SELECT url, response_key_id FROM idempotent_operations WHERE key = 'k-sealed'"
        ).fetchone()
    assert url == receiver.url("/v1/charges?api_key=…&page=…")
    assert key_id == "k1"
    raw = stored(ledger)
    for secret in (b"QUERYSECRET9", b"BODYSECRET", b"BEARERSECRET", first.content):
        assert secret not in raw


def test_a_key_that_does_not_open_the_answer_raises_and_sends_nothing(receiver, tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    charge(ledger, receiver, "k-locked", seal_keys=[OLD])
    for keys, says in (([NEW], 'key id "k1"'), ([], "none is configured")):
        with pytest.raises(ir.LedgerError) as raised:
            charge(ledger, receiver, "k-locked", seal_keys=keys)
        assert says in str(raised.value)
        assert raised.value.attempts == 0
    assert receiver.effects_for("k-locked") == 1


def test_a_seal_key_not_of_the_id_hex_form_is_refused():
    with pytest.raises(ValueError, match="seal_keys: invalid seal key"):
        ir.Transport(seal_keys=["k1:not-hex"])
    with pytest.raises(TypeError, match="seal_keys"):
        ir.Transport(seal_keys=OLD)
