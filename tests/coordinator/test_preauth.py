"""A real coordinator on 127.0.0.1 against a client without the secret: it listens on one port, on the
configured address only; nothing of the job can be read or written there without the handshake; and
before authentication it reads only small frames, validates proofs strictly, and holds at most a fixed
number of connections. Every socket and coordinator is closed by its test."""

from __future__ import annotations

import datetime
import json
import os
import socket
import struct
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.coordinator.refusals import refused_by_category
from slurm_elastic.wire import channel as ch
from slurm_elastic.wire import messages as msg

pytestmark = pytest.mark.timeout(90)
JOB = "preauth"


@pytest.fixture
def coordinator() -> Iterator[CoordinatorThread]:
    thread = CoordinatorThread(CoordinatorConfig(job_id=JOB, secret=ch.new_secret(), expected_workers=2)).start()
    try:
        yield thread
    finally:
        thread.stop()


def frame(body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    return struct.pack(">I", len(data)) + data


def read_frame(sock: socket.socket) -> bytes:
    header = b""
    while len(header) < 4:
        chunk = sock.recv(4 - len(header))
        if not chunk:
            return b""
        header += chunk
    (length,) = struct.unpack(">I", header)
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            break
        body += chunk
    return body


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True once the server closed the connection (EOF or reset) within `seconds`."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def refusals(thread: CoordinatorThread) -> Counter[str]:
    """Refused handshakes by category, those not yet summed up in an event included (reported now)."""
    thread.call(thread.coordinator.report_refusals)
    return refused_by_category(thread.coordinator.events.all())


def listening_sockets() -> list[tuple[str, int]]:
    """(address, port) of every TCP socket this process listens on (the coordinator runs in it)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        target = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in mine:  # 0A: LISTEN
                continue
            raw, port = fields[1].split(":")
            if width == 8:
                address = socket.inet_ntop(socket.AF_INET, bytes.fromhex(raw)[::-1])
            else:
                words = [bytes.fromhex(raw[i : i + 8])[::-1] for i in range(0, 32, 8)]
                address = socket.inet_ntop(socket.AF_INET6, b"".join(words))
            found.append((address, int(port, 16)))
    return found


def test_one_port_on_the_configured_address_and_nothing_readable_there() -> None:
    """The attacker finds every port of the job and tries torch's TCPStore protocol and raw store calls."""
    before = set(listening_sockets())  # (earlier tests of this process may have left some)
    coordinator = CoordinatorThread(CoordinatorConfig(job_id=JOB, secret=ch.new_secret(), expected_workers=2))
    try:
        coordinator.start()
        _attack_every_port(coordinator, [p for p in listening_sockets() if p not in before])
    finally:
        coordinator.stop()


def _attack_every_port(coordinator: CoordinatorThread, ports: list[tuple[str, int]]) -> None:
    host, port = ch.parse_address(coordinator.address)
    assert ports == [(host, port)]  # torch's TCPStore bound every interface on a port of its own
    for address, found in ports:
        with pytest.raises((RuntimeError, dist.DistStoreError)):
            client = dist.TCPStore(
                address, found, is_master=False, timeout=datetime.timedelta(seconds=2), wait_for_workers=False
            )
            client.set("stolen", "x")
            client.get("stolen")
        with socket.create_connection((address, found), timeout=5) as sock:
            assert msg.Challenge.model_validate_json(read_frame(sock)).job_id == JOB
            sock.sendall(frame({"type": "store", "id": 1, "op": "list_keys"}))
            assert closed_within(sock, 5)
    assert coordinator.coordinator.store.state.count == 0


def test_a_wrong_proof_for_the_store_role_is_refused(coordinator: CoordinatorThread) -> None:
    with socket.create_connection(ch.parse_address(coordinator.address), timeout=5) as sock:
        challenge = msg.Challenge.model_validate_json(read_frame(sock))
        forged = ch.proof(ch.new_secret(), challenge.nonce, "store", JOB)
        sock.sendall(frame({"type": "hello", "role": "store", "job_id": JOB, "nonce": "cd" * 16, "proof": forged}))
        assert msg.Refused.model_validate_json(read_frame(sock)).reason == "bad job secret"
        assert closed_within(sock, 5)
    assert refusals(coordinator) == {"bad proof": 1}


@pytest.mark.parametrize("length", [1025, 1024 * 1024, 0xFFFFFFFF])
def test_an_oversized_frame_before_authentication_is_refused_at_once(
    coordinator: CoordinatorThread, length: int
) -> None:
    with socket.create_connection(ch.parse_address(coordinator.address), timeout=5) as sock:
        read_frame(sock)
        sock.sendall(struct.pack(">I", length) + b"x" * 100)
        started = time.monotonic()
        assert closed_within(sock, 2)  # not after the handshake timeout: nothing more is read
        assert time.monotonic() - started < 1.5
    deadline = time.monotonic() + 5
    while refusals(coordinator) != {"oversized frame": 1}:
        assert time.monotonic() < deadline, refusals(coordinator)
        time.sleep(0.01)


@pytest.mark.parametrize("bad", ["z" * 64, "é" * 64, "F" * 64, "0" * 63, "0" * 65, "00" * 16 + " " * 32])
def test_a_proof_that_is_not_hex_of_the_exact_length_is_refused(coordinator: CoordinatorThread, bad: str) -> None:
    with socket.create_connection(ch.parse_address(coordinator.address), timeout=5) as sock:
        read_frame(sock)
        sock.sendall(frame({"type": "hello", "role": "worker", "job_id": JOB, "nonce": "cd" * 16, "proof": bad}))
        assert closed_within(sock, 2)
    deadline = time.monotonic() + 5
    while refusals(coordinator) != {"malformed hello": 1}:
        assert time.monotonic() < deadline, refusals(coordinator)
        time.sleep(0.01)


def test_thousands_of_idle_connections_hold_no_more_than_the_cap(coordinator: CoordinatorThread) -> None:
    gate = coordinator.coordinator.connections.gate
    fds_before = len(os.listdir("/proc/self/fd"))
    idle: list[socket.socket] = []
    try:
        for _ in range(2000):
            idle.append(socket.create_connection(ch.parse_address(coordinator.address), timeout=5))
        deadline = time.monotonic() + 20
        while gate.evicted < 2000 - ch.MAX_PENDING_HANDSHAKES:  # the loop accepts them all
            assert time.monotonic() < deadline, gate.evicted
            time.sleep(0.05)
        server_side = len(os.listdir("/proc/self/fd")) - fds_before - len(idle)
        assert len(gate) <= ch.MAX_PENDING_HANDSHAKES
        assert server_side <= ch.MAX_PENDING_HANDSHAKES + 8
        # An honest client still gets in at once, while the idle ones are held.
        started = time.monotonic()
        reply = ch.request(
            coordinator.address, msg.StatusRequest(), secret=coordinator.coordinator.config.secret, job_id=JOB
        )
        assert isinstance(reply, msg.StatusReply) and time.monotonic() - started < 2
    finally:
        for sock in idle:
            sock.close()


def test_idle_handshakes_end_at_the_timeout(coordinator: CoordinatorThread, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ch, "HANDSHAKE_TIMEOUT_S", 0.3)
    socks = [socket.create_connection(ch.parse_address(coordinator.address), timeout=5) for _ in range(5)]
    try:
        for sock in socks:
            assert closed_within(sock, 3)
        assert len(coordinator.coordinator.connections.gate) == 0
        assert refusals(coordinator) == {"timeout": 5}
    finally:
        for sock in socks:
            sock.close()
