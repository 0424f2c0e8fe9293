"""Nodes as separate hosts: each slurmd in a network namespace of its own, and a job that talks over its
nodes' addresses only, on the interface it was told to use."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest

from slurm_elastic.commands.jobs import render_status, status_of
from slurm_elastic.errors import ElasticError
from slurm_elastic.eventtypes import JobFailed, NodeRegistered
from slurm_elastic.jobdir import JobHandle
from slurm_elastic.testing.devcluster import LocalCluster
from slurm_elastic.testing.devcluster.sockets import TcpSocket
from slurm_elastic.waiting import wait_until
from slurm_elastic.wire import messages as msg

from .elastic_jobs import ElasticSlurmJob, reference_model, submit_core

pytestmark = pytest.mark.timeout(400)


def _host(end: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(end.rsplit(":", 1)[0].strip("[]"))


def job_sockets(cluster: LocalCluster, nodes: list[str]) -> dict[str, list[tuple[str, TcpSocket]]]:
    """node -> (command, socket) of every TCP socket its job tasks hold now."""
    return {node: [(cmd, s) for cmd, sockets in cluster.task_sockets(node).values() for s in sockets] for node in nodes}


def status(job: ElasticSlurmJob) -> msg.StatusReply:
    found: list[msg.StatusReply] = []

    def answered() -> bool:
        try:
            found.append(status_of(JobHandle.read(job.dir)))
        except ElasticError:
            return False
        return True

    wait_until(answered, timeout=60, what="the job's coordinator to answer", poll=0.5)
    return found[-1]


def check_wiring(cluster: LocalCluster, job: ElasticSlurmJob, nodes: list[str], groups_net: str) -> None:
    """No task socket on loopback; control connections on the management network, to the batch host's
    address; worker-to-worker connections (gloo) between node addresses of `groups_net`."""
    batch = job.info().batch_host
    coordinator = JobHandle.read(job.dir).address
    assert coordinator.rsplit(":", 1)[0] == cluster.address(batch), coordinator
    found = job_sockets(cluster, nodes)
    on_loopback = [(n, cmd, s) for n, pairs in found.items() for cmd, s in pairs if s.on_loopback]
    assert not on_loopback, f"job tasks on loopback: {on_loopback[:5]}"
    peers = {str(_host(cluster.address(n, groups_net))) for n in nodes}
    for node, pairs in found.items():
        connected = [s for _, s in pairs if not s.listening]
        to_coordinator = [s for s in connected if s.remote == coordinator]
        assert to_coordinator, f"{node}: no connection to the coordinator at {coordinator}: {connected}"
        assert all(str(_host(s.local)) == cluster.address(node) for s in to_coordinator)
        # gloo's pairs: from this node's address on groups_net to another node's on the same network.
        mine = cluster.address(node, groups_net)
        gloo = [s for s in connected if str(_host(s.local)) == mine and str(_host(s.remote)) in peers - {mine}]
        assert gloo, f"{node}: no group connection from {mine} to the other nodes {sorted(peers - {mine})}: {connected}"


def test_a_job_talks_over_its_nodes_addresses_only_through_a_kill_and_a_join(
    hosts: LocalCluster, elastic_jobs: list[ElasticSlurmJob], tmp_path: Path
) -> None:
    job = submit_core(tmp_path / "hosts", nodes="3", steps=60, pause=0.4)
    elastic_jobs.append(job)
    job.wait_step(5)
    nodes = list(job.info().nodes)
    check_wiring(hosts, job, nodes, "mgmt")
    reply = status(job)
    for node in nodes:
        assert reply.node_interfaces[node] == f"mgmt0 {hosts.address(node)} (route to the coordinator)"
    assert f"{nodes[0]} mgmt0 {hosts.address(nodes[0])}" in render_status(reply)
    victim = nodes[-1]
    hosts.kill_node(victim)
    job.wait("the job to shrink", lambda: job.worlds()[-1:] == [2], timeout=60)
    hosts.restart_node(victim)
    job.wait("the node to rejoin", lambda: job.worlds()[-1:] == [3], timeout=90)
    job.wait_step(job.last_step() + 2)
    check_wiring(hosts, job, nodes, "mgmt")
    job.wait_finished()
    job.assert_same_training(reference_model(tmp_path.parent, 60))


def test_slurm_elastic_ifname_puts_the_groups_on_the_fabric(
    hosts: LocalCluster, elastic_jobs: list[ElasticSlurmJob], tmp_path: Path
) -> None:
    job = submit_core(tmp_path / "fabric", nodes="2", steps=30, pause=0.4, env={"SLURM_ELASTIC_IFNAME": "fab0"})
    elastic_jobs.append(job)
    job.wait_step(5)
    nodes = list(job.info().nodes)
    check_wiring(hosts, job, nodes, "fab")  # control stays on mgmt0: the coordinator's address is there
    registered = {e.node: e.interface for e in job.of(NodeRegistered)}
    assert registered == {n: f"fab0 {hosts.address(n, 'fab')} (SLURM_ELASTIC_IFNAME)" for n in nodes}
    job.wait_finished()
    job.assert_same_training(reference_model(tmp_path.parent, 30))


def test_an_interface_the_nodes_lack_fails_the_job_naming_it(
    hosts: LocalCluster, elastic_jobs: list[ElasticSlurmJob], tmp_path: Path
) -> None:
    job = submit_core(tmp_path / "no-ib", nodes="2", steps=30, pause=0.1, env={"SLURM_ELASTIC_IFNAME": "ib0"})
    elastic_jobs.append(job)
    info = job.wait_finished(timeout=120, hurry=False)
    assert info.state == "FAILED", info
    output = job.output()
    assert "SLURM_ELASTIC_IFNAME='ib0': this node has no such interface" in output, output[-3000:]
    assert "fab0" in output and "mgmt0" in output
    failed = job.of(JobFailed)
    assert failed and "ib0" in failed[-1].reason, failed
    assert os.path.exists(job.dir)
