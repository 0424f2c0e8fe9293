"""Partitions as faults: a node's management link cut (its packets vanish, no socket closes) for less
than a lease, and for longer; a node cut off from the batch host alone; a one-way cut between two workers
that both still reach the coordinator. The batch host cut off from every other node (and slurmctld) is
the last fault of the suite's chaos run (test_chaos_slurm.py), checked there: the cut side stops without
a generation of its own, the others requeue the job, which resumes from its checkpoint.
The job's settings here: heartbeat 0.5 s, lease 5 s (elastic_jobs.job_env)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm_elastic.coordinator.reachability import PROBE_TIMEOUT_S, RECHECK_S
from slurm_elastic.eventtypes import (
    HangEvicted,
    MembershipChange,
    NodeLost,
    NodeReadmitted,
    NodeRegistered,
    NodeUnresponsive,
    PeersUnreachable,
    Recovered,
    SlurmJobStarted,
)
from slurm_elastic.testing.devcluster import LocalCluster

from .elastic_jobs import ElasticSlurmJob, reference_model, submit_core

pytestmark = pytest.mark.timeout(420)
LEASE_S = 5.0


def _ends_as_the_uninterrupted_run(job: ElasticSlurmJob, tmp_path: Path, steps: int, timeout: float = 300.0) -> None:
    """The job finishes with the reference model, every sample once and no step committed twice."""
    job.wait_finished(timeout=timeout)
    job.assert_same_training(reference_model(tmp_path.parent, steps))
    assert job.ledger().steps_committed_twice == 0


def _victim(job: ElasticSlurmJob) -> str:
    """A node that is not the batch host (whose cut is the coordinator's own: another case)."""
    info = job.info()
    return next(n for n in reversed(info.nodes) if n != info.batch_host)


def test_a_link_down_for_less_than_a_lease_is_at_most_a_pause(
    hosts: LocalCluster,
    elastic_jobs: list[ElasticSlurmJob],
    tmp_path: Path,
) -> None:
    job = submit_core(tmp_path / "blip", nodes="3", steps=40, pause=0.3)
    elastic_jobs.append(job)
    job.wait_step(6)
    victim = _victim(job)
    hosts.set_link(victim, up=False)
    try:
        time.sleep(LEASE_S * 0.4)
    finally:
        hosts.set_link(victim, up=True)
    job.wait_finished()
    assert job.worlds() == [3], "nobody was evicted"
    assert not job.of(NodeUnresponsive) and not job.of(HangEvicted) and not job.of(NodeLost)
    assert not job.of(Recovered), "nothing was re-run"
    job.assert_same_training(reference_model(tmp_path.parent, 40))


def test_a_link_down_for_longer_evicts_the_node_which_rejoins_as_a_new_member(
    hosts: LocalCluster,
    elastic_jobs: list[ElasticSlurmJob],
    tmp_path: Path,
) -> None:
    job = submit_core(tmp_path / "cut", nodes="3", steps=150, pause=0.3)  # rejoins well before the end
    elastic_jobs.append(job)
    job.wait_step(6)
    victim = _victim(job)
    hosts.set_link(victim, up=False)
    try:
        job.wait("the survivors to go on without the node", lambda: job.worlds()[-1:] == [2], timeout=60)
        cut_at = job.last_step()
        job.wait_step(cut_at + 3)  # training goes on while the node is still cut off
        time.sleep(3 * LEASE_S)  # its agent finds the coordinator silent (a lease) and ends its workers
    finally:
        hosts.set_link(victim, up=True)
    job.wait("the node to rejoin", lambda: job.worlds()[-1:] == [3], timeout=120)
    (started,) = job.of(SlurmJobStarted)  # never requeued: the job went on, the cut-off node rejoined it
    assert started.restart_count == 0
    rejoined = job.of(MembershipChange)[-1]
    assert rejoined.generation > 2 and any(w.startswith(f"{victim}:") for w in rejoined.joined), rejoined
    assert "requeue_withheld" in job.output()  # its old agent found the coordinator alive once back
    (silent,) = job.of(NodeUnresponsive)
    assert silent.node == victim
    recovered = [e for e in job.of(Recovered) if e.silent_to_commit_s is not None]
    assert recovered, job.of(Recovered)
    # From the node's last word to the next commit: a lease, then one abort and re-formed group, with
    # a wide margin for this machine's noise (docs/admin-guide.md states the bound and its settings).
    assert LEASE_S < recovered[0].silent_to_commit_s < 4 * LEASE_S, recovered[0]
    assert [e.node for e in job.of(NodeRegistered)].count(victim) == 2  # it came back as a new agent
    # Fenced: the stale workers committed nothing, wrote no ledger entry: every sample once, no step twice.
    _ends_as_the_uninterrupted_run(job, tmp_path, 150)


def test_a_node_cut_off_from_the_batch_host_alone_is_evicted_and_never_requeues_the_job(
    hosts: LocalCluster,
    elastic_jobs: list[ElasticSlurmJob],
    tmp_path: Path,
) -> None:
    job = submit_core(tmp_path / "lonely", nodes="3", steps=300, pause=0.3)
    elastic_jobs.append(job)
    job.wait_step(6)
    info = job.info()
    victim = _victim(job)
    assert info.batch_host is not None
    hosts.set_route(victim, info.batch_host, blocked=True)  # it still reaches slurmctld and the other node
    try:
        job.wait("the survivors to go on without the node", lambda: job.worlds()[-1:] == [2], timeout=60)
        # Its agent finds the coordinator silent (a lease), asks it in vain (10 s), then finds Slurm still
        # reaching the batch host: it waits, and requeues nothing. (Not much longer: the launcher gives up
        # on a node after three agents in a row fail to start there, 15 s apart.)
        time.sleep(LEASE_S + 15)
        assert "job_requeued_after_coordinator_loss" not in job.output()
    finally:
        hosts.set_route(victim, info.batch_host, blocked=False)
    job.wait("its agent to withhold the requeue", lambda: "requeue_withheld" in job.output(), timeout=60)
    job.wait("the node to rejoin", lambda: job.worlds()[-1:] == [3], timeout=120)
    (started,) = job.of(SlurmJobStarted)
    assert started.restart_count == 0, "a healthy job was requeued"
    assert "job_requeued_after_coordinator_loss" not in job.output()
    _ends_as_the_uninterrupted_run(job, tmp_path, 300)


def test_a_one_way_cut_between_two_workers_evicts_one_until_the_route_is_back(
    hosts: LocalCluster,
    elastic_jobs: list[ElasticSlurmJob],
    tmp_path: Path,
) -> None:
    pg_timeout = 10.0  # the collective's timeout: how long the cut goes unseen (no heartbeat stops)
    env = {"SLURM_ELASTIC_PG_TIMEOUT_S": str(pg_timeout), "SLURM_ELASTIC_MAX_RESTARTS": "2"}
    job = submit_core(tmp_path / "oneway", nodes="3", steps=300, pause=0.3, env=env)
    elastic_jobs.append(job)
    job.wait_step(6)
    info = job.info()
    near, far = [n for n in info.nodes if n != info.batch_host]  # both keep their way to the coordinator
    hosts.set_route(near, far, blocked=True)  # what `near` sends to `far` vanishes; the reverse arrives
    try:
        job.wait("one side of the cut to be evicted", lambda: job.worlds()[-1:] == [2], timeout=90)
        (seen,) = job.of(PeersUnreachable)
        assert seen.evicted == (far,) and f"{near}>{far}" in seen.failing, seen  # the later ranks go
        cut_at = job.last_step()
        job.wait_step(cut_at + 5)  # the others train on while the cut lasts
        time.sleep(RECHECK_S + 2 * PROBE_TIMEOUT_S)  # its restarted workers are tried again, and wait outside
        assert job.worlds()[-1] == 2 and not job.of(NodeReadmitted)
    finally:
        hosts.set_route(near, far, blocked=False)
    job.wait("the node to be readmitted and rejoin", lambda: job.worlds()[-1:] == [3], timeout=90)
    (back,) = job.of(NodeReadmitted)
    assert back.node == far and back.workers, back
    assert not job.of(NodeUnresponsive) and not job.of(NodeLost), "no heartbeat stopped"
    recovered = [e for e in job.of(Recovered) if e.silent_to_commit_s is not None]
    assert recovered, job.of(Recovered)
    # From the last commit before the cut to the next: the collective's timeout, a probe round and one
    # re-formed group (docs/admin-guide.md states the bound and its settings), with a wide margin.
    assert pg_timeout < recovered[0].silent_to_commit_s < 3 * pg_timeout, recovered[0]
    (started,) = job.of(SlurmJobStarted)
    assert started.restart_count == 0
    _ends_as_the_uninterrupted_run(job, tmp_path, 300)
