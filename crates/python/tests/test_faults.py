"""Exactly-once under faults, through the sync Transport against the workspace's test
receiver: the attempts, one key on all of them, the effects, and what is raised."""

from __future__ import annotations

import datetime
import socket
import time

import httpx
import pytest

import idempotent_retry as ir
from conftest import FAST


def client(**options):
    return httpx.Client(transport=ir.Transport(**{**FAST, **options}))


def report(response) -> ir.Report:
    return response.extensions["idempotent_retry"]


def charge(c, receiver, key, amount=500, **kwargs):
    return c.post(
        receiver.url("/v1/charges"),
        json={"amount": amount},
        headers={"Idempotency-Key": key},
        **kwargs,
    )


def test_503_then_200_one_key_on_both_attempts_one_effect(receiver):
    receiver.inject("status", key="k-503", attempt=1, status=503)
    response = charge(client(), receiver, "k-503")
    assert response.status_code == 200
    assert response.json() == {"effect": 1}
    assert report(response).attempts == 2
    assert report(response).outcome == "done"
    assert receiver.keys() == ["k-503", "k-503"]
    assert receiver.effects_for("k-503") == 1


def test_a_reset_after_the_effect_is_answered_by_the_receivers_replay(receiver):
    receiver.inject("reset_after_commit", key="k-reset", attempt=1)
    response = charge(client(), receiver, "k-reset")
    assert response.status_code == 200
    assert response.headers["Idempotent-Replayed"] == "true"
    assert report(response).attempts == 2
    assert receiver.keys() == ["k-reset", "k-reset"]
    assert receiver.effects_for("k-reset") == 1


def test_a_close_without_reply_is_retried_under_the_same_key(receiver):
    receiver.inject("close_without_reply", key="k-close", attempt=1)
    response = charge(client(), receiver, "k-close")
    assert response.status_code == 200
    assert receiver.keys() == ["k-close", "k-close"]
    assert receiver.effects_for("k-close") == 1


def test_409_in_progress_is_waited_out_then_replayed(receiver):
    # The first attempt's handler takes 0.6 s; the attempt gives up after 0.2 s, the retries
    # meet the key in progress (409) until the first run's answer is saved and replayed.
    receiver.inject("slow_handler", key="k-409", attempt=1, seconds=0.6)
    response = charge(client(attempt_timeout=0.2, max_attempts=10, base_delay=0.1, max_delay=0.2), receiver,
                      "k-409", timeout=httpx.Timeout(None))
    assert response.status_code == 200
    assert response.headers["Idempotent-Replayed"] == "true"
    assert any("409" in line for line in receiver.log()), receiver.log()
    assert set(receiver.keys()) == {"k-409"}
    assert receiver.effects_for("k-409") == 1


def test_409_in_progress_answers_are_waits_not_attempts(receiver):
    for attempt in (1, 2, 3):
        receiver.inject("status", key="k-409-wait", attempt=attempt, status=409)
    response = charge(client(max_attempts=2), receiver, "k-409-wait")
    assert response.status_code == 200
    assert report(response).attempts == 4
    assert report(response).in_progress_waits == 3
    assert report(response).in_progress_wait > datetime.timedelta(0)
    assert report(response).stopped is None
    assert receiver.keys() == ["k-409-wait"] * 4
    assert receiver.effects_for("k-409-wait") == 1


def test_still_in_progress_past_max_in_progress_wait_is_outcome_unknown(receiver):
    for attempt in range(1, 200):
        receiver.inject("status", key="k-409-long", attempt=attempt, status=409)
    with pytest.raises(ir.HTTPStatusError) as raised:
        charge(client(max_in_progress_wait=0.2), receiver, "k-409-long")
    # Raised with the last answer, as for attempts that ran out, and why the waits stopped.
    error = raised.value
    assert error.response.status_code == 409
    assert error.kind == "still_in_progress"
    assert error.outcome == "unknown"
    stop = report(error.response)
    assert stop.stopped == "still_in_progress"
    assert stop.in_progress_waits == stop.attempts - 1 == error.attempts - 1
    assert datetime.timedelta(0) < stop.in_progress_wait <= datetime.timedelta(seconds=0.2, microseconds=1)
    assert "still reported the operation in progress after 200ms" in str(error)
    assert "max_in_progress_wait=SECONDS sets how long to wait" in str(error)
    assert "RetryPolicy" not in str(error)
    assert set(receiver.keys()) == {"k-409-long"}
    assert receiver.effects() == 0

    # 0: the first "in progress" ends it.
    receiver.inject("status", key="k-409-zero", attempt=1, status=409)
    with pytest.raises(ir.HTTPStatusError) as raised:
        charge(client(max_in_progress_wait=0), receiver, "k-409-zero")
    assert raised.value.response.status_code == 409
    assert raised.value.kind == "still_in_progress"
    assert raised.value.attempts == 1
    assert "(max_in_progress_wait=0)" in str(raised.value)
    assert receiver.keys().count("k-409-zero") == 1


def test_429_with_retry_after_is_honoured(receiver):
    receiver.inject("status", key="k-429", attempt=1, status=429, retry_after=1)
    started = time.monotonic()
    response = charge(client(), receiver, "k-429")
    waited = time.monotonic() - started
    assert response.status_code == 200
    assert report(response).attempts == 2
    assert waited >= 1.0
    assert receiver.effects_for("k-429") == 1


def test_a_stall_past_the_timeout_raises_read_timeout_with_outcome_unknown(receiver):
    for attempt in (1, 2):
        receiver.inject("stall_after_commit", key="k-stall", attempt=attempt, seconds=5)
    c = client(max_attempts=2)
    started = time.monotonic()
    with pytest.raises(httpx.TimeoutException) as raised:
        charge(c, receiver, "k-stall", timeout=0.3)
    error = raised.value
    assert isinstance(error, httpx.ReadTimeout)
    assert isinstance(error, ir.OperationError)
    assert error.outcome == "unknown" and error.is_outcome_unknown
    assert error.key == "k-stall"
    assert error.attempts == 2
    assert error.kind == "attempts_exhausted"
    assert error.failure == "timeout"
    assert "k-stall" in str(error)
    assert error.request.url.path == "/v1/charges"
    # httpx's timeout of 0.3 s is the attempt timeout: two attempts, not two of 30 s.
    assert time.monotonic() - started < 3
    assert receiver.effects_for("k-stall") == 1


def test_no_listener_raises_connect_error_not_done():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(httpx.ConnectError) as raised:
        client(max_attempts=2).post(
            f"http://127.0.0.1:{port}/v1/charges", content=b"x", headers={"Idempotency-Key": "k-c"}
        )
    assert raised.value.outcome == "not_done"
    assert raised.value.key == "k-c"
    assert raised.value.attempts == 2


def test_every_attempt_503_raises_with_the_last_answer_and_the_stop_reported(receiver):
    for attempt in (1, 2, 3):
        receiver.inject("status", key="k-down", attempt=attempt, status=503)
    with pytest.raises(httpx.HTTPStatusError) as raised:
        charge(client(max_attempts=3), receiver, "k-down")
    error = raised.value
    assert error.response.status_code == 503
    assert error.kind == report(error.response).stopped == "attempts_exhausted"
    assert error.outcome == "unknown"
    assert error.attempts == 3
    assert receiver.keys() == ["k-down"] * 3
    assert receiver.effects() == 0


def test_a_final_answer_is_not_retried(receiver):
    receiver.inject("status", key="k-400", attempt=1, status=400)
    response = charge(client(), receiver, "k-400")
    assert response.status_code == 400
    assert report(response).attempts == 1
    assert report(response).stopped is None


def test_a_streamed_body_goes_out_whole_once(receiver):
    def chunks():
        yield b'{"amount": '
        yield b"500}"

    response = client().post(
        receiver.url("/v1/charges"), content=chunks(), headers={"Idempotency-Key": "k-stream"}
    )
    assert response.status_code == 200
    assert receiver.effects_for("k-stream") == 1


def test_a_streamed_body_is_not_sent_twice(receiver):
    receiver.inject("status", key="k-once", attempt=1, status=503)

    def chunks():
        yield b"part one, "
        yield b"part two"

    with pytest.raises(ir.HTTPStatusError) as raised:
        client().post(
            receiver.url("/v1/charges"), content=chunks(), headers={"Idempotency-Key": "k-once"}
        )
    # The one attempt's answer, with the reason the retry due was not made.
    assert raised.value.response.status_code == 503
    assert raised.value.kind == "body_not_replayable"
    assert raised.value.attempts == 1
    assert receiver.keys() == ["k-once"]


def test_a_streamed_body_cut_off_by_a_reset_raises_body_not_replayable(receiver):
    receiver.inject("reset_before_handler", key="k-gone", attempt=1)

    def chunks():
        yield b"only once"

    with pytest.raises(ir.BodyNotReplayable) as raised:
        client().post(
            receiver.url("/v1/charges"), content=chunks(), headers={"Idempotency-Key": "k-gone"}
        )
    assert isinstance(raised.value, httpx.TransportError)
    assert raised.value.kind == "body_not_replayable"
    assert raised.value.outcome == "unknown"
    assert raised.value.attempts == 1
    assert receiver.keys() == ["k-gone"]


def test_headers_and_body_arrive_as_sent_and_come_back_in_order(receiver):
    response = client().post(
        receiver.url("/v1/charges?currency=eur"),
        content=b'{"amount": 7}',
        headers=[("X-Trace", "a"), ("X-Trace", "b"), ("Idempotency-Key", "k-h")],
    )
    assert response.status_code == 200
    assert response.headers.get_list("content-type") == ["application/json"]
    assert response.http_version == "HTTP/1.1"
    assert receiver.effects_for("k-h") == 1


def test_every_attempt_503_has_its_history_in_the_report(receiver):
    for attempt in (1, 2):
        receiver.inject("status", key="k-hist", attempt=attempt, status=503)
    with pytest.raises(ir.HTTPStatusError) as raised:
        charge(client(max_attempts=2), receiver, "k-hist")
    got = report(raised.value.response)
    assert raised.value.response.status_code == 503 and got.outcome == "unknown"
    assert raised.value.history == got.history
    assert [(a.number, a.status, a.failure) for a in got.history] == [
        (1, 503, "server_error"),
        (2, 503, "server_error"),
    ]
    first, second = got.history
    assert first.started < datetime.timedelta(seconds=0.1)
    assert first.wait is not None and second.wait is None
    assert second.started >= first.wait
    assert got.elapsed >= second.started


def test_a_503_then_a_timeout_raises_with_elapsed_and_the_history(receiver):
    receiver.inject("status", key="k-503-stall", attempt=1, status=503)
    receiver.inject("stall_after_commit", key="k-503-stall", attempt=2, seconds=5)
    started = time.monotonic()
    with pytest.raises(ir.OperationError) as raised:
        charge(client(max_attempts=2), receiver, "k-503-stall", timeout=0.3)
    took = time.monotonic() - started
    error = raised.value
    assert isinstance(error, httpx.ReadTimeout)
    assert error.outcome == "unknown"
    assert [(a.number, a.status, a.failure) for a in error.history] == [
        (1, 503, "server_error"),
        (2, None, "timeout"),
    ]
    assert isinstance(error.elapsed, datetime.timedelta)
    # The second attempt's 0.3 s timeout is in it, and it is no longer than the call.
    assert datetime.timedelta(seconds=0.3) <= error.elapsed <= datetime.timedelta(seconds=took)
    assert error.history[1].started >= error.history[0].wait


def test_a_refused_connection_raises_with_elapsed_and_the_history():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(httpx.ConnectError) as raised:
        client(max_attempts=2).post(
            f"http://127.0.0.1:{port}/v1/charges", content=b"x", headers={"Idempotency-Key": "k-h"}
        )
    took = time.monotonic() - started
    error = raised.value
    assert error.outcome == "not_done"
    assert [(a.number, a.status, a.failure) for a in error.history] == [
        (1, None, "connect"),
        (2, None, "connect"),
    ]
    assert error.history[0].wait is not None and error.history[1].wait is None
    assert datetime.timedelta(0) < error.elapsed <= datetime.timedelta(seconds=took)


def test_an_error_raised_before_sending_has_no_history(receiver):
    with pytest.raises(ir.InvalidRequest) as raised:
        client().post(receiver.url("/v1/charges"), headers={"Idempotency-Key": "bad key\x01"})
    assert raised.value.history == ()
    assert raised.value.elapsed == datetime.timedelta(0)
