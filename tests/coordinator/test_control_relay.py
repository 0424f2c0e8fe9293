"""A node's control relay between its workers and a real coordinator on 127.0.0.1: the workers register,
heartbeat and are assigned as if direct, over one connection per node; a worker that closes is lost, one the
coordinator drops is closed; a lost relay loses its workers, a lost coordinator closes them; a relay speaks
for its own workers only. Every coordinator, relay and connection is stopped by its test."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.coordinator.relayed import RelayedWriter
from slurm_elastic.rendezvous.relay import RelayThread
from slurm_elastic.wire import channel as ch
from slurm_elastic.wire import messages as msg

pytestmark = pytest.mark.timeout(60)
JOB = "relayed"
HEARTBEAT_S = 0.2


@pytest.fixture
def coordinator() -> Iterator[CoordinatorThread]:
    config = CoordinatorConfig(
        job_id=JOB, secret=ch.new_secret(), expected_workers=3, heartbeat_interval_s=HEARTBEAT_S, lease_timeout_s=30.0
    )
    thread = CoordinatorThread(config).start()
    try:
        yield thread
    finally:
        thread.stop()


@contextlib.contextmanager
def node_relay(thread: CoordinatorThread) -> Iterator[RelayThread]:
    relay = RelayThread(thread.address, thread.coordinator.config.secret, JOB, control=True, beat_s=HEARTBEAT_S)
    relay.start()
    try:
        yield relay
    finally:
        relay.stop()


@contextlib.contextmanager
def workers(address: str, secret: str, names: list[str]) -> Iterator[list[ch.Channel]]:
    opened: list[ch.Channel] = []
    try:
        for i, name in enumerate(names):
            worker = ch.connect(address, secret=secret, job_id=JOB, role="worker", timeout=5)
            opened.append(worker)
            worker.send(msg.Register(worker_id=name, node=name.split(":")[0], local_rank=i, pid=1, committed_step=-1))
            assert isinstance(worker.recv(timeout=10), msg.Registered)
        yield opened
    finally:
        for worker in opened:
            worker.close()


def eventually(condition: Callable[[], bool], what: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def next_of(worker: ch.Channel, kind: type[msg.Message], seconds: float = 10.0) -> msg.Message:
    """The next message of `kind` (pulses and others in between are skipped)."""
    deadline = time.monotonic() + seconds
    while True:
        message = worker.recv(deadline=deadline)
        if isinstance(message, kind):
            return message


def connections_of_workers(thread: CoordinatorThread) -> int:
    def connections() -> int:
        writers = [p.writer for p in thread.coordinator.workers.values()]
        return len({id(w.relay) if isinstance(w, RelayedWriter) else id(w) for w in writers})

    return int(thread.call(connections))


NAMES = ["n1:0:0", "n1:1:0", "n1:2:0"]


def test_a_nodes_workers_form_a_generation_over_one_connection(coordinator: CoordinatorThread) -> None:
    secret = coordinator.coordinator.config.secret
    with node_relay(coordinator) as relay, workers(relay.address, secret, NAMES) as (a, b, c):
        assert relay.address.startswith("unix:")
        ranks = set()
        for worker in (a, b, c):
            assign = next_of(worker, msg.Assign)
            assert isinstance(assign, msg.Assign) and assign.generation == 1
            ranks.add(assign.rank)
        assert ranks == {0, 1, 2}
        assert connections_of_workers(coordinator) == 1
        relay.pulse(msg.Pulse(generation=1))  # the node's pulse, as its agent hands it on
        for worker in (a, b, c):
            assert isinstance(next_of(worker, msg.Pulse), msg.Pulse)
        for step, worker in enumerate((a, b, c), start=5):
            worker.send(msg.Heartbeat(generation=1, step=step, phase="compute"))
        steps = lambda: {m.worker_id: m.step for m in coordinator.status().members}  # noqa: E731
        eventually(lambda: steps() == dict(zip(NAMES, (5, 6, 7), strict=True)), steps)
        a.send(msg.Committed(generation=1, step=1, loss=0.5, samples=3, world=3, time=time.time()))
        eventually(lambda: coordinator.status().step == 1, coordinator.status)


def test_a_worker_that_closes_is_lost_and_one_the_coordinator_drops_is_closed(coordinator: CoordinatorThread) -> None:
    secret = coordinator.coordinator.config.secret
    with node_relay(coordinator) as relay, workers(relay.address, secret, NAMES) as (a, b, c):
        for worker in (a, b, c):
            next_of(worker, msg.Assign)
        a.close()
        for worker in (b, c):
            assign = next_of(worker, msg.Assign)
            assert isinstance(assign, msg.Assign) and assign.generation == 2 and "n1:0:0" in assign.left
        coordinator.call(lambda: coordinator.coordinator.driver.lose("n1:1:0", "dropped by the test"))
        with pytest.raises((ConnectionError, OSError)):
            while True:
                b.recv(timeout=10)
        eventually(lambda: [m.worker_id for m in coordinator.status().members] == ["n1:2:0"], coordinator.status)


def test_a_lost_relay_loses_its_workers_and_a_lost_coordinator_closes_them(coordinator: CoordinatorThread) -> None:
    secret = coordinator.coordinator.config.secret
    with node_relay(coordinator) as relay, workers(relay.address, secret, NAMES[:2]) as (a, b):
        eventually(lambda: len(coordinator.status().members) == 2, coordinator.status)
        relay.stop()
        eventually(lambda: not coordinator.status().members, coordinator.status)
        for worker in (a, b):  # and their connections end with the relay
            with pytest.raises((ConnectionError, OSError)):
                while True:
                    worker.recv(timeout=10)
    with node_relay(coordinator) as relay, workers(relay.address, secret, ["n2:0:0"]) as (d,):
        coordinator.stop()  # d is registered (workers() waited for it)
        with pytest.raises((ConnectionError, OSError)):
            while True:
                d.recv(timeout=10)


def test_a_relay_speaks_for_its_own_workers_only(coordinator: CoordinatorThread) -> None:
    secret = coordinator.coordinator.config.secret
    with node_relay(coordinator) as relay, workers(relay.address, secret, NAMES[:1]) as (a,):
        stranger = ch.connect(coordinator.address, secret=secret, job_id=JOB, role="relay", timeout=5)
        try:
            # Someone else's worker: its heartbeat is not taken, and a first frame that is no registration
            # is refused (that worker's connection closed), the relay's connection kept.
            stranger.send(msg.Beats(beats=[("n1:0:0", 0, 99, "compute")]))
            heartbeat = msg.Heartbeat(generation=0, step=1, phase="compute").model_dump_json()
            stranger.send(msg.Relayed(worker="n9:0:0", frame=heartbeat))
            closed = stranger.recv(timeout=10)
            assert isinstance(closed, msg.RelayClosed) and closed.worker == "n9:0:0"
            steps = lambda: [m.step for m in coordinator.status().members]  # noqa: E731
            assert steps() == [-1]  # the beats came before the refusal: read, and not taken
            register = msg.Register(worker_id="n8:0:0", node="n8", local_rank=0, pid=1, committed_step=-1)
            stranger.send(msg.Relayed(worker="n9:0:0", frame=register.model_dump_json()))  # not its own name
            assert isinstance(stranger.recv(timeout=10), msg.RelayClosed)
            a.send(msg.Heartbeat(generation=0, step=3, phase="init"))
            eventually(lambda: steps() == [3], steps)
            dropped = [e for e in coordinator.status().events if e.get("event") == "message_dropped"]
            assert len(dropped) == 2 and all("relay" in str(e.get("sender")) for e in dropped), dropped
        finally:
            stranger.close()


def test_direct_and_relayed_workers_share_one_generation(coordinator: CoordinatorThread) -> None:
    """The relayed newcomers' whole ranks come once per node (a roster) and the direct one's in its own
    Assign: every member resolves the same ranks."""
    secret = coordinator.coordinator.config.secret
    with (
        node_relay(coordinator) as relay,
        workers(relay.address, secret, NAMES[:2]) as relayed,
        workers(coordinator.address, secret, ["n2:0:0"]) as direct,
    ):
        assigns = [next_of(worker, msg.Assign) for worker in (*relayed, *direct)]
        assert all(isinstance(a, msg.Assign) for a in assigns)
        ranks = {tuple(a.ranks) for a in assigns if isinstance(a, msg.Assign)}
        assert len(ranks) == 1 and sorted(next(iter(ranks))) == sorted([*NAMES[:2], "n2:0:0"])
        assert sorted(a.rank for a in assigns if isinstance(a, msg.Assign)) == [0, 1, 2]
        assert connections_of_workers(coordinator) == 2


def test_a_worker_hears_its_registrations_answer_before_any_pulse() -> None:
    """The pulse comes through the node's agent, beside the coordinator's connection: a worker still waiting
    for its registration's answer must get the answer first (a pulse there failed its registration)."""
    secret, got_register, answer = ch.new_secret(), threading.Event(), threading.Event()
    loop = asyncio.new_event_loop()

    async def coordinator(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await ch.accept_handshake(reader, writer, secret=secret, job_id=JOB) == "relay"
        first = await ch.read_message(reader)
        assert isinstance(first, msg.Relayed) and first.worker == "n1:0:0"
        got_register.set()
        await loop.run_in_executor(None, answer.wait)
        settings = msg.WorkerSettings(heartbeat_interval_s=1.0, pg_timeout_s=60.0, backend="gloo", store_prefix="s")
        registered = msg.Registered(settings=settings)
        ch.write_message(writer, msg.Relayed(worker="n1:0:0", frame=registered.model_dump_json()))
        await writer.drain()
        await reader.read()  # until the relay goes

    server = loop.run_until_complete(asyncio.start_server(coordinator, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    relay = RelayThread(address, secret, JOB, control=True, beat_s=HEARTBEAT_S).start()
    worker = ch.connect(relay.address, secret=secret, job_id=JOB, role="worker", timeout=5)
    try:
        worker.send(msg.Register(worker_id="n1:0:0", node="n1", local_rank=0, pid=1, committed_step=-1))
        assert got_register.wait(10)
        relay.pulse(msg.Pulse(generation=0))  # the agent's, before the coordinator answered
        answer.set()
        assert isinstance(worker.recv(timeout=10), msg.Registered)
        relay.pulse(msg.Pulse(generation=0))
        assert isinstance(worker.recv(timeout=10), msg.Pulse)  # once answered, the pulses come
    finally:
        worker.close()
        relay.stop()
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()
