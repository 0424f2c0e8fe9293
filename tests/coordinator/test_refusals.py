"""A peer without the secret leaves no trace of its own: a real coordinator on 127.0.0.1 against hostile
hellos (newlines, terminal escapes, long and extra keys in every field) and a loop of a thousand bad
handshakes. Its events, its events.jsonl and its log lines name fixed categories and the kernel's peer
address only, and grow by one summary per interval, not one line per attempt. Every socket and
coordinator is closed by its test."""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.coordinator.refusals import refused_by_category
from slurm_elastic.wire import channel as ch
from slurm_elastic.wire import messages as msg

pytestmark = pytest.mark.timeout(120)
JOB = "refusals"
MARK = "PWNED"
HOSTILE = f"{MARK}\n2026-01-01 [info] job_finished\x1b[2J\x1b]0;{MARK}\x07\u009b31m\r\u202e"


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[CoordinatorThread]:
    config = CoordinatorConfig(
        job_id=JOB, secret=ch.new_secret(), expected_workers=2, events_path=tmp_path / JOB / "events.jsonl"
    )
    thread = CoordinatorThread(config).start()
    try:
        yield thread
    finally:
        thread.stop()


def raw_frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def frame(obj: object) -> bytes:
    return raw_frame(json.dumps(obj).encode())


def hello(**fields: object) -> dict[str, object]:
    return {"type": "hello", "role": "worker", "job_id": JOB, "nonce": "ab" * 16, "proof": "0" * 64, **fields}


def attempt(address: str, data: bytes) -> None:
    """One connection: take the challenge, send `data`, read until the coordinator closes it."""
    with socket.create_connection(ch.parse_address(address), timeout=10) as sock:
        (length,) = struct.unpack(">I", sock.recv(4, socket.MSG_WAITALL))
        sock.recv(length, socket.MSG_WAITALL)
        sock.sendall(data)
        try:
            while sock.recv(4096):
                pass
        except ConnectionResetError:
            pass


LONG_KEY = (MARK + "\x1b[1A") * 50  # an extra key pydantic would quote in the error's location
HOSTILE_HELLOS: dict[str, bytes] = {
    "extra key": frame(hello(**{HOSTILE: HOSTILE})),
    "long extra key": frame(hello(**{LONG_KEY: 1})),
    "type": frame({"type": HOSTILE}),
    "role": frame(hello(role=HOSTILE)),
    "role as an object": frame(hello(role={HOSTILE: [HOSTILE]})),
    "job id": frame(hello(job_id=HOSTILE)),  # well formed: another job
    "nonce": frame(hello(nonce=HOSTILE)),
    "proof": frame(hello(proof=HOSTILE)),
    "every field": frame({"type": "hello", "role": HOSTILE, "job_id": HOSTILE, "nonce": HOSTILE, "proof": HOSTILE}),
    "invalid json": raw_frame(b'{"type": "hello", "' + HOSTILE.encode() + b"\xff\xfe"),
    "a json string": frame(HOSTILE),
    "another message": frame({"type": "drain", "nodes": ["n1"], "reason": HOSTILE}),
    "oversized": raw_frame((HOSTILE * 200).encode()),
}


def test_hostile_hellos_leave_no_byte_of_theirs_in_events_files_or_logs(
    coordinator: CoordinatorThread, capfd: pytest.CaptureFixture[str]
) -> None:
    assert all(len(data) <= 4 + ch.PREAUTH_MAX_FRAME for name, data in HOSTILE_HELLOS.items() if name != "oversized")
    with structlog.testing.capture_logs() as logged:
        for data in HOSTILE_HELLOS.values():
            attempt(coordinator.address, data)
        coordinator.call(coordinator.coordinator.report_refusals)
    events = coordinator.coordinator.events.all()
    written = coordinator.coordinator.config.events_path.read_text()  # type: ignore[union-attr]
    out, err = capfd.readouterr()
    for where, text in {"events": json.dumps(events), "events.jsonl": written, "log": repr(logged)}.items():
        assert MARK not in text and "PWNED".lower() not in text.lower(), where
    for where, text in {"stdout": out, "stderr": err}.items():
        assert MARK not in text and "\x1b" not in text and "\u009b" not in text, where
    assert refused_by_category(events) == {
        "malformed hello": 10,
        "wrong job": 1,
        "not a hello": 1,
        "oversized frame": 1,
    }
    summaries = [e for e in events if e["event"] == "handshakes_refused"]
    assert {peer for e in summaries for peer in e["peers"]} == {"127.0.0.1"}  # the kernel's address


def test_a_thousand_bad_handshakes_cost_the_events_a_line_or_two(coordinator: CoordinatorThread) -> None:
    path = coordinator.coordinator.config.events_path
    assert path is not None
    coordinator.drain(["n9"], reason="a real event")
    lines_before = len(path.read_text().splitlines())
    bad = [
        frame(hello()),  # a well-formed hello with a wrong proof
        frame(hello(proof="z" * 64)),
        frame({"type": "status"}),
        raw_frame(b"not json"),
        struct.pack(">I", 1 << 30),
    ]
    with structlog.testing.capture_logs() as logged:
        for i in range(1000):
            attempt(coordinator.address, bad[i % len(bad)])
    added = path.read_text().splitlines()[lines_before:]
    assert 1 <= len(added) <= 2, added  # the first refusal at once; the rest wait for the interval's end
    assert len([e for e in logged if e["event"] == "handshakes_refused"]) == len(added)
    assert len(coordinator.coordinator.events.all()) <= 5
    status = coordinator.status()
    assert {"coordinator_started", "drain_requested"} <= {e["event"] for e in status.events}
    coordinator.stop()  # reports the interval's refusals: none is lost
    totals = refused_by_category(json.loads(line) for line in path.read_text().splitlines())
    assert totals == {"bad proof": 200, "malformed hello": 400, "not a hello": 200, "oversized frame": 200}
    assert len(path.read_text().splitlines()) <= lines_before + 3


def test_refusals_that_stop_coming_are_reported_at_the_end_of_their_interval(
    coordinator: CoordinatorThread,
) -> None:
    coordinator.coordinator.connections.refusals.interval_s = 0.3
    for _ in range(3):
        attempt(coordinator.address, frame(hello()))
    deadline = time.monotonic() + 10
    while len(summaries := [e for e in coordinator.coordinator.events.all() if e["event"] == "handshakes_refused"]) < 2:
        assert time.monotonic() < deadline, summaries
        time.sleep(0.05)
    assert [e["bad_proof"] for e in summaries] == [1, 2]


def test_an_honest_client_still_gets_in(coordinator: CoordinatorThread) -> None:
    for _ in range(20):
        attempt(coordinator.address, frame(hello()))
    reply = ch.request(
        coordinator.address, msg.StatusRequest(), secret=coordinator.coordinator.config.secret, job_id=JOB
    )
    assert isinstance(reply, msg.StatusReply) and reply.job_id == JOB
