"""A cut between two member nodes that both still reach the coordinator, as the coordinator sees it: a
real coordinator on 127.0.0.1, its agents and workers played over real authenticated connections. A fault
report starts a probe round; the agents' answers decide whom it evicts; an evicted node's new workers wait,
registered, until a later round finds the node reachable again."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import TypeVar

import pytest
from pydantic import BaseModel

from slurm_elastic.commands.jobs import render_status
from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread, reachability
from slurm_elastic.eventtypes import NodeReadmitted, PeersUnreachable, of_kind
from slurm_elastic.wire import channel as ch
from slurm_elastic.wire import messages as msg

pytestmark = pytest.mark.timeout(120)
JOB = "reach"
NODES = ("n1", "n2", "n3")
M = TypeVar("M", bound=BaseModel)


class Cluster:
    def __init__(self, thread: CoordinatorThread) -> None:
        self.thread = thread
        self.agents: dict[str, ch.Channel] = {}
        self.workers: dict[str, ch.Channel] = {}

    def connect(self, role: msg.Role) -> ch.Channel:
        secret = self.thread.coordinator.config.secret
        return ch.connect(self.thread.address, secret=secret, job_id=JOB, role=role, timeout=5)

    def agent(self, node: str) -> None:
        channel = self.connect("agent")
        channel.send(msg.RegisterNode(node=node, host=node, nproc=1, pid=1, probe=f"10.0.0.{node[1:]}:4000"))
        assert isinstance(channel.recv(timeout=10), msg.Ack)
        self.agents[node] = channel

    def worker(self, wid: str) -> ch.Channel:
        channel = self.connect("worker")
        node, local, _ = wid.split(":")
        channel.send(msg.Register(worker_id=wid, node=node, local_rank=int(local), pid=1, committed_step=-1))
        assert isinstance(channel.recv(timeout=10), msg.Registered)
        self.workers[wid] = channel
        return channel

    def events(self, kind: type[M]) -> list[M]:
        return of_kind(self.thread.coordinator.events.recent(500), kind)  # type: ignore[type-var]

    def close(self) -> None:
        for channel in (*self.agents.values(), *self.workers.values()):
            channel.close()


def expect(channel: ch.Channel, kind: type[M], timeout: float = 10.0) -> M:
    """The next message of `kind` on `channel`, past the coordinator's pulses."""
    deadline = time.monotonic() + timeout
    while True:
        message = channel.recv(timeout=max(0.01, deadline - time.monotonic()))
        if isinstance(message, kind):
            return message
        assert isinstance(message, msg.Pulse), message


def nothing_but_pulses(channel: ch.Channel, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            message = channel.recv(timeout=left)
        except TimeoutError:
            return
        assert isinstance(message, msg.Pulse), message


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.setattr(reachability, "RECHECK_S", 0.3)
    config = CoordinatorConfig(job_id=JOB, secret=ch.new_secret(), expected_workers=3, lease_timeout_s=120.0)
    thread = CoordinatorThread(config).start()
    cluster = Cluster(thread)
    try:
        for node in NODES:
            cluster.agent(node)
        for node in NODES:
            cluster.worker(f"{node}:0:0")
        for channel in cluster.workers.values():
            assert expect(channel, msg.Assign).generation == 1
        yield cluster
    finally:
        cluster.close()
        thread.stop()


def answer_probes(cluster: Cluster, unreachable: dict[str, list[str]]) -> msg.Probe:
    probes = {node: expect(cluster.agents[node], msg.Probe) for node in NODES}
    assert len({p.model_dump_json() for p in probes.values()}) == 1  # the same round to every node
    for node, channel in cluster.agents.items():
        channel.send(msg.ProbeResult(round=probes[node].round, unreachable=unreachable.get(node, [])))
    return probes["n1"]


def test_a_cut_between_two_members_evicts_the_later_one_until_it_is_reachable_again(cluster: Cluster) -> None:
    cluster.workers["n1:0:0"].send(msg.CollectiveFault(generation=1, step=4, detail="timed out in allreduce"))
    probe = answer_probes(cluster, {"n2": ["n3"], "n3": ["n2"]})
    assert probe.targets == {n: f"10.0.0.{n[1:]}:4000" for n in NODES}
    kill = expect(cluster.agents["n3"], msg.KillWorker)
    assert kill.worker_id == "n3:0:0" and "unreachable from n2" in kill.reason
    for wid in ("n1:0:0", "n2:0:0"):
        assign = expect(cluster.workers[wid], msg.Assign)
        assert assign.generation == 2 and assign.left == ["n3:0:0"] and assign.boundary_step is None
    (seen,) = cluster.events(PeersUnreachable)
    assert seen.failing == ("n2>n3", "n3>n2") and seen.evicted == ("n3",) and seen.nodes == 3

    # Its agent restarts the worker: it registers, and waits outside while n3 is still cut off.
    cluster.workers["n3:0:1"] = cluster.worker("n3:0:1")
    answer_probes(cluster, {"n2": ["n3"]})  # a recheck: still cut
    nothing_but_pulses(cluster.workers["n1:0:0"], 1.0)
    assert not cluster.events(NodeReadmitted)
    held = cluster.thread.status()  # what `slurm-elastic status` shows meanwhile
    assert held.held == {"n3:0:1": "n3"} and "held out until they reach every member again: n3" in render_status(held)
    assert re.search(r"held +n3:0:1", render_status(held))
    answer_probes(cluster, {})  # the route is back
    assert expect(cluster.workers["n1:0:0"], msg.ChangePending).generation == 2  # it joins at a boundary
    (back,) = cluster.events(NodeReadmitted)
    assert back.node == "n3" and back.workers == ("n3:0:1",) and back.held_s > 0
    assert cluster.thread.status().held == {}


def test_when_every_node_reaches_every_other_the_same_members_form_again(cluster: Cluster) -> None:
    for wid in ("n2:0:0", "n3:0:0"):  # every member reports; one round answers them all
        cluster.workers[wid].send(msg.CollectiveFault(generation=1, step=4, detail="timed out"))
    answer_probes(cluster, {})
    for channel in cluster.workers.values():
        assign = expect(channel, msg.Assign)
        assert assign.generation == 2 and assign.left == [] and assign.joined == []
    (seen,) = cluster.events(PeersUnreachable)
    assert seen.evicted == () and seen.failing == ()
    for channel in cluster.agents.values():
        nothing_but_pulses(channel, 0.5)  # no second round


def test_an_agent_that_does_not_answer_does_not_hold_the_job(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster.thread.coordinator.reachability, "probe_timeout_s", 0.5)
    cluster.workers["n1:0:0"].send(msg.CollectiveFault(generation=1, step=4, detail="timed out"))
    for node in ("n1", "n2"):  # n3 stays silent
        probe = expect(cluster.agents[node], msg.Probe)
        cluster.agents[node].send(msg.ProbeResult(round=probe.round, unreachable=[]))
    for channel in cluster.workers.values():
        assert expect(channel, msg.Assign).generation == 2
