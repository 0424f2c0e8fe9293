"""Notifying a coordinator: a real one gets the drain; a dead, stalled or wrong one costs at most the bound."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.eventtypes import DrainRequested, of_kind
from slurm_elastic.hooks.notify import notify
from slurm_elastic.jobdir import JobHandle
from slurm_elastic.wire.channel import new_secret

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def coordinator() -> Iterator[tuple[CoordinatorThread, JobHandle]]:
    secret = new_secret()
    thread = CoordinatorThread(CoordinatorConfig(job_id="55", secret=secret, expected_workers=2)).start()
    try:
        yield thread, JobHandle("55", thread.address, secret, "localhost", 0, time.time())
    finally:
        thread.stop()


def test_the_coordinator_records_the_drain(coordinator: tuple[CoordinatorThread, JobHandle]) -> None:
    thread, handle = coordinator
    sent = notify(handle, ["n3"], "now", "n3 left running job 55", "epilog", timeout_s=5)
    assert sent.ok, sent
    (event,) = of_kind(thread.coordinator.events.all(), DrainRequested)
    assert (event.nodes, event.mode, event.source) == (("n3",), "now", "epilog")


def test_a_wrong_secret_is_refused(coordinator: tuple[CoordinatorThread, JobHandle]) -> None:
    _, handle = coordinator
    forged = JobHandle(handle.job_id, handle.address, new_secret(), "h", 0, 0.0)
    sent = notify(forged, ["n3"], "now", "x", "epilog", timeout_s=5)
    assert sent.result == "refused"
    assert forged.secret not in sent.detail and handle.secret not in sent.detail


def test_an_unreachable_coordinator_is_reported_at_once() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens there
    sent = notify(JobHandle("1", f"127.0.0.1:{port}", new_secret(), "h", 0, 0.0), ["n1"], "now", "x", "epilog")
    assert sent.result == "unreachable" and sent.duration_ms < 2000


def test_a_stalled_coordinator_costs_at_most_the_bound() -> None:
    # Accepts the connection and never says a word (a coordinator stopped with SIGSTOP).
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        started = time.monotonic()
        sent = notify(JobHandle("1", address, new_secret(), "h", 0, 0.0), ["n1"], "now", "x", "epilog", timeout_s=0.5)
        assert sent.result == "timeout"
        assert time.monotonic() - started < 1.5
    finally:
        stop.set()
        acceptor.join(5)
        server.close()
        for conn in accepted:
            conn.close()


def test_a_long_reason_is_cut_to_what_the_message_allows(coordinator: tuple[CoordinatorThread, JobHandle]) -> None:
    _, handle = coordinator
    assert notify(handle, ["n2"], "boundary", "r" * 5000, "healthcheck", timeout_s=5).ok
