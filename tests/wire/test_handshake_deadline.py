"""The client's side of the handshake against a server that dribbles a byte at a time, on 127.0.0.1: the
handshake, and a `request`'s reply, must end by one deadline, not one per read. Every server thread and
socket is closed by its test."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from slurm_elastic.wire import channel as ch
from slurm_elastic.wire import messages as msg

from .fakes import Script, fake_server, frame, read_frame

pytestmark = pytest.mark.timeout(60)
SECRET = ch.new_secret()
JOB = "job-7"
DEADLINE_S = 0.5  # the handshake timeout these tests run with
DRIBBLE_S = 0.1  # between two bytes: well within any one read's timeout


def dribble(conn: socket.socket, data: bytes, stop: threading.Event) -> None:
    for i in range(len(data)):
        if stop.wait(DRIBBLE_S):
            return
        conn.sendall(data[i : i + 1])


def padded(body: dict[str, Any], size: int = 1000) -> bytes:
    """`body` as JSON padded with spaces to `size` bytes: a long dribble of a frame the client accepts."""
    data = json.dumps(body).encode()
    return frame(data + b" " * (size - len(data)))


def challenge() -> dict[str, Any]:
    return {"type": "challenge", "job_id": JOB, "nonce": "ab" * 16}


def in_thread(fn: Callable[[], Any], wait_s: float) -> tuple[bool, Any]:
    """Run `fn` in a thread for at most `wait_s`: (whether it ended, what it returned or raised)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(wait_s)
    return (not thread.is_alive(), outcome[0] if outcome else None)


def dribbles_the_challenge(conn: socket.socket, stop: threading.Event) -> None:
    dribble(conn, padded(challenge()), stop)


def dribbles_the_welcome(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(frame(challenge()))
    read_frame(conn)
    dribble(conn, padded({"type": "welcome", "proof": "0" * 64}), stop)


def pauses_within_each_read(conn: socket.socket, stop: threading.Event) -> None:
    """Every pause shorter than a read's timeout, all of them together longer than the handshake's."""
    conn.sendall(frame(challenge()))
    read_frame(conn)
    welcome = frame({"type": "welcome", "proof": "0" * 64})
    for part in (welcome[:2], welcome[2:10], welcome[10:]):
        if stop.wait(DEADLINE_S * 0.6):
            return
        conn.sendall(part)
    stop.wait(30)


@pytest.mark.parametrize(
    "server",
    [dribbles_the_challenge, dribbles_the_welcome, pauses_within_each_read],
    ids=["challenge", "welcome", "pauses"],
)
def test_a_dribbling_server_fails_the_handshake_by_one_deadline(
    server: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ch, "HANDSHAKE_TIMEOUT_S", DEADLINE_S)
    with fake_server(server) as address:
        started = time.monotonic()
        ended, result = in_thread(
            lambda: ch.connect(address, secret=SECRET, job_id=JOB, role="worker", timeout=5), 10 * DEADLINE_S
        )
        elapsed = time.monotonic() - started
    assert ended, "the handshake was still running at 10 times its deadline"
    assert isinstance(result, TimeoutError), result
    assert "within the handshake timeout of 0.5 s" in str(result)
    assert elapsed < 10 * DEADLINE_S


def test_a_request_reply_dribbled_by_an_authenticated_server_ends_by_its_timeout() -> None:
    def honest_then_slow(conn: socket.socket, stop: threading.Event) -> None:
        nonce = "cd" * 16
        conn.sendall(frame({"type": "challenge", "job_id": JOB, "nonce": nonce}))
        hello = read_frame(conn)
        welcome = ch.server_proof(SECRET, hello["nonce"], nonce, hello["role"], JOB)
        conn.sendall(frame({"type": "welcome", "proof": welcome}))
        read_frame(conn)  # the request
        dribble(conn, padded({"type": "ack", "ok": True, "detail": ""}, 5000), stop)

    timeout = 1.0
    with fake_server(honest_then_slow) as address:
        ended, result = in_thread(
            lambda: ch.request(address, msg.StatusRequest(), secret=SECRET, job_id=JOB, timeout=timeout), 10 * timeout
        )
    assert ended, "the request was still waiting for its reply at 10 times its timeout"
    assert isinstance(result, TimeoutError), result


def test_recv_with_a_timeout_bounds_the_whole_frame() -> None:
    left, right = socket.socketpair()
    stop = threading.Event()
    sender = threading.Thread(target=dribble, args=(right, padded({"type": "status"}, 500), stop), daemon=True)
    sender.start()
    try:
        ended, result = in_thread(lambda: ch.Channel(left).recv(timeout=DEADLINE_S), 10 * DEADLINE_S)
        assert ended and isinstance(result, TimeoutError), result
    finally:
        stop.set()
        sender.join(5)
        left.close()
        right.close()


def test_a_prompt_server_is_not_hurried() -> None:
    """The deadline bounds a stranger's dribble, not an honest frame: a whole frame in one read passes."""
    left, right = socket.socketpair()
    try:
        right.sendall(frame({"type": "status"}))
        assert ch.Channel(left).recv(timeout=DEADLINE_S, deadline=time.monotonic() + DEADLINE_S) == msg.StatusRequest()
    finally:
        left.close()
        right.close()
