"""Tests against the real local Slurm cluster (`make cluster-up`): fixtures and the `slurm` marker.

Without a reachable cluster these tests skip, or fail where the cluster is required
(SLURM_ELASTIC_REQUIRE_SLURM=1, as `make test` sets, or CI=true).
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.testing.devcluster import LocalCluster
from slurm_elastic.testing.devcluster.unkillable import report_step, step_log, summarize

from .elastic_jobs import ElasticSlurmJob

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # This hook sees the whole session: mark only the tests that live under tests/slurm.
    for item in items:
        if _HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.slurm)


def _required() -> bool:
    return os.environ.get("SLURM_ELASTIC_REQUIRE_SLURM") == "1" or os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalCluster]:
    """The local cluster, with SLURM_CONF set in this process so that subprocesses reach it."""
    cluster = LocalCluster()
    if not cluster.is_up():
        message = f"local Slurm cluster in {cluster.state_dir} is not running: run `make cluster-up`"
        if _required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    saved = {key: os.environ.get(key) for key in cluster.env()}
    os.environ.update(cluster.env())
    try:
        yield cluster
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def elastic_jobs(slurm_cluster: LocalCluster) -> Iterator[list[ElasticSlurmJob]]:
    """The elastic jobs a test submits (it appends them): cancelled at its end, and any node it killed or
    cut off brought back."""
    started: list[ElasticSlurmJob] = []
    yield started
    for job in started:
        job.cancel()
    for node in slurm_cluster.nodes:
        if slurm_cluster.node_states().get(node, "").startswith("down"):
            # Killed, or cut off long enough for slurmctld to mark it down: a node rebooted, as an admin would
            # (slurmctld asks a down node again only every few minutes; a fresh slurmd registers at once).
            slurm_cluster.kill_node(node)
            slurm_cluster.restart_node(node)
    slurm_cluster.wait_nodes(slurm_cluster.nodes, want_idle=True, timeout_s=120)


@pytest.fixture(autouse=True)
def no_job_socket_on_loopback(slurm_cluster: LocalCluster) -> Iterator[None]:
    """With nodes as hosts, a job task's TCP socket bound to or connected through loopback fails the test:
    nodes talk over their own addresses. Sampled every second while the test runs (a connection that opens
    and closes between two samples can go unseen)."""
    if slurm_cluster.net is None:
        yield
        return
    seen: dict[tuple[str, str, str], str] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            try:
                found = slurm_cluster.loopback_task_sockets()
            except (OSError, ValueError):  # a process ended while it was read: the next sample sees the rest
                continue
            for node, cmd, sock in found:
                seen.setdefault((node, sock.local, sock.remote), cmd)

    sampler = threading.Thread(target=sample, name="loopback-sampler", daemon=True)
    sampler.start()
    yield
    stop.set()
    sampler.join(timeout=30)
    shown = [f"{node} {local} -> {remote}: {cmd}" for (node, local, remote), cmd in list(seen.items())[:5]]
    assert not seen, "job tasks used loopback on a cluster of separate hosts:\n" + "\n".join(shown)


@pytest.fixture(autouse=True)
def nodes_back_in_service(slurm_cluster: LocalCluster) -> Iterator[None]:
    """A node a test leaves drained, down or failed is reported with Slurm's reason and resumed before the
    next test, so that one failure never cascades. Slurm draining a node for a step it could not kill
    ("Kill task failed") is a defect of ours: that test fails."""
    before = set(slurm_cluster.layout.unkillable_reports())
    yield
    found = slurm_cluster.recover_nodes(timeout_s=120)
    for node, state, reason in found:
        warnings.warn(f"{node} was left {state} ({reason or 'no reason'}); resumed", stacklevel=1)
    unkillable = [f"{node}: {reason}" for node, _, reason in found if "Kill task failed" in reason]
    if unkillable:
        left = []  # what slurmstepd found still there when it gave up, and how far it got (devcluster/unkillable.py)
        for report in slurm_cluster.layout.unkillable_reports():
            if report in before:
                continue
            left += [f"{report}:", *summarize(report.read_text(errors="replace"))]
            for log in slurm_cluster.layout.slurmd_logs():
                left += step_log(log.read_text(errors="replace"), *report_step(report.name))
        message = f"Slurm could not end a step of this test: {'; '.join(unkillable)}"
        pytest.fail("\n".join([message, *left]), pytrace=False)


@pytest.fixture
def hosts(slurm_cluster: LocalCluster) -> LocalCluster:
    """The cluster, whose nodes must be separate hosts (SLURM_ELASTIC_CLUSTER_NETWORK=hosts, the default):
    where the Slurm tests are required, a loopback cluster fails the test rather than skip it."""
    if slurm_cluster.net is None:
        message = "the local cluster runs every node on 127.0.0.1 (SLURM_ELASTIC_CLUSTER_NETWORK=loopback)"
        if _required():
            pytest.fail(f"nodes as hosts are required here: {message}", pytrace=False)
        pytest.skip(message)
    return slurm_cluster
