"""The coordinator's side of a split: a real coordinator on 127.0.0.1 whose agents and workers are played
over real connections. When half its nodes or more fall silent at once it stops without a new generation
and asks for a requeue; one silent node of four is evicted and the job goes on."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.eventtypes import E, JobFailed, MembershipChange, NodeUnresponsive, of_kind
from slurm_elastic.wire import channel as ch
from slurm_elastic.wire import messages as msg

pytestmark = pytest.mark.timeout(120)
JOB = "quorum"
NODES = ("n1", "n2", "n3", "n4")


class Job:
    """Four nodes, one worker each; every peer heartbeats until its node is `silenced` (its worker alone
    once its node is in `silenced_workers`)."""

    def __init__(self, thread: CoordinatorThread) -> None:
        self.thread = thread
        self.silenced: set[str] = set()
        self.silenced_workers: set[str] = set()
        self.peers: list[tuple[str, str, ch.Channel]] = []
        self._stop = threading.Event()
        secret = thread.coordinator.config.secret
        for node in NODES:
            agent = ch.connect(thread.address, secret=secret, job_id=JOB, role="agent", timeout=5)
            agent.send(msg.RegisterNode(node=node, host=node, nproc=1, pid=1))
            assert isinstance(agent.recv(timeout=10), msg.Ack)
            self.peers.append((node, "agent", agent))
        for node in NODES:
            worker = ch.connect(thread.address, secret=secret, job_id=JOB, role="worker", timeout=5)
            worker.send(msg.Register(worker_id=f"{node}:0:0", node=node, local_rank=0, pid=1, committed_step=-1))
            assert isinstance(worker.recv(timeout=10), msg.Registered)
            self.peers.append((node, "worker", worker))
        self._beats = threading.Thread(target=self._beat, daemon=True)
        self._beats.start()

    def _beat(self) -> None:
        while not self._stop.wait(0.1):
            for node, role, channel in self.peers:
                if node not in self.silenced and not (role == "worker" and node in self.silenced_workers):
                    with contextlib.suppress(OSError):  # closed by the coordinator
                        channel.send(msg.Heartbeat(generation=1, step=3, phase="allreduce"))

    def events(self, kind: type[E]) -> list[E]:
        return of_kind(self.thread.coordinator.events.recent(500), kind)

    def close(self) -> None:
        self._stop.set()
        self._beats.join()
        for _, _, channel in self.peers:
            channel.close()


@pytest.fixture
def job() -> Iterator[Job]:
    config = CoordinatorConfig(
        job_id=JOB, secret=ch.new_secret(), expected_workers=4, heartbeat_interval_s=0.1, lease_timeout_s=1.0
    )
    thread = CoordinatorThread(config).start()
    job = Job(thread)
    try:
        deadline = time.monotonic() + 10
        while thread.view().generation != 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield job
    finally:
        job.close()
        thread.stop()


def wait_for(what: str, predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_batch_host_cut_off_from_three_nodes_stops_its_side_and_asks_for_a_requeue(job: Job) -> None:
    job.silenced |= {"n2", "n3", "n4"}
    wait_for("the job to fail", lambda: job.thread.view().phase == "failed")
    (failed,) = job.events(JobFailed)
    assert "3 of 4 nodes fell silent" in failed.reason and "no majority" in failed.reason
    assert job.thread.coordinator.driver.requeue_after_failure
    assert [e.world for e in job.events(MembershipChange)] == [4], "no generation formed on the smaller side"
    assert {e.node for e in job.events(NodeUnresponsive)} == {"n2", "n3", "n4"}


def test_a_cut_whose_silences_reach_their_leases_over_several_scans_still_forms_no_generation(job: Job) -> None:
    # The workers fall silent first, then one node, then the other two: each reaches its lease in a later
    # scan (lease 1 s, scans every 0.5 s). Judged one by one, the first would be evicted and a generation
    # formed on the smaller side before the others' leases ran out.
    job.silenced_workers |= {"n2", "n3", "n4"}
    time.sleep(0.2)
    job.silenced.add("n2")
    time.sleep(0.3)
    job.silenced |= {"n3", "n4"}
    wait_for("the job to fail", lambda: job.thread.view().phase == "failed")
    (failed,) = job.events(JobFailed)
    assert "3 of 4 nodes fell silent" in failed.reason, failed.reason
    assert [e.world for e in job.events(MembershipChange)] == [4], "no generation formed on the smaller side"


def test_a_worker_silent_on_a_node_that_still_speaks_is_evicted_alone(job: Job) -> None:
    job.silenced_workers.add("n3")
    wait_for("the job to shrink", lambda: job.thread.view().world == 3)
    assert job.thread.view().phase == "running" and not job.events(NodeUnresponsive)


def test_one_silent_node_of_four_is_evicted_and_the_job_goes_on(job: Job) -> None:
    job.silenced.add("n4")
    wait_for("the job to shrink", lambda: job.thread.view().world == 3)
    time.sleep(1.5)  # past another lease: nothing else follows
    assert job.thread.view().phase == "running" and not job.events(JobFailed)
    assert not job.thread.coordinator.driver.requeue_after_failure
