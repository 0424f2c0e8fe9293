"""Every Slurm event that takes nodes away or frees them becomes a membership change, on the real cluster."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_elastic.eventtypes import (
    AgentRelaunched,
    CheckpointFallback,
    DrainRequested,
    GenerationReady,
    HangEvicted,
    JobCancelled,
    JobFailed,
    JobSuspended,
    MembershipChange,
    NodeLost,
    NodeUnresponsive,
    Recovered,
    RestartAll,
    SlurmJobStarted,
)
from slurm_elastic.faults import FaultPlan
from slurm_elastic.testing.devcluster import LocalCluster
from slurm_elastic.worker.checkpoints.checkpoint import list_checkpoints

from .elastic_jobs import ElasticSlurmJob, job_env, reference_model, submit_core

pytestmark = pytest.mark.timeout(400)


def test_node_failure_is_handled_long_before_slurm_notices(
    slurm_cluster: LocalCluster, elastic_jobs: list[ElasticSlurmJob], tmp_path: Path
) -> None:
    job = submit_core(tmp_path / "node-failure", nodes="4", steps=80, pause=0.6)
    elastic_jobs.append(job)
    job.wait_step(6)
    killed_at = time.time()
    slurm_cluster.kill_node("n3")
    job.wait("the job to shrink", lambda: 3 in job.worlds(), timeout=60)
    change = next(e for e in job.of(MembershipChange) if e.world == 3)
    assert change.time - killed_at < 25, "recovery must not wait for Slurm's SlurmdTimeout (30 s)"
    assert not slurm_cluster.node_states()["n3"].startswith("down"), "Slurm had not noticed yet"
    slurm_cluster.restart_node("n3")  # the node comes back: the job starts an agent there, which rejoins
    job.wait("n3 to rejoin", lambda: job.worlds()[-1:] == [4], timeout=90)
    rejoin = job.of(MembershipChange)[-1]
    assert rejoin.cause == "join" and rejoin.boundary_step is not None
    # The same node dies again, under the agent the job started there: that agent's srun outlives it and
    # must not keep the node from getting the next one.
    slurm_cluster.kill_node("n3")
    job.wait("the job to shrink again", lambda: job.worlds()[-1:] == [3], timeout=60)
    slurm_cluster.restart_node("n3")
    job.wait("n3 to rejoin again", lambda: job.worlds()[-1:] == [4], timeout=90)
    assert [e.node for e in job.of(AgentRelaunched)] == ["n3", "n3"]
    job.wait_finished()
    job.assert_same_training(reference_model(tmp_path.parent, 80))


def test_abrupt_shrink_is_handled_like_a_failure(elastic_jobs: list[ElasticSlurmJob], tmp_path: Path) -> None:
    job = submit_core(tmp_path / "shrink", nodes="4", steps=40, pause=0.3)
    elastic_jobs.append(job)
    job.wait_step(6)
    subprocess.run(["scontrol", "update", f"JobId={job.job_id}", "NumNodes=2"], check=True, timeout=30)
    job.wait("the job to shrink to 2", lambda: job.worlds()[-1:] == [2], timeout=60)
    assert len(job.info().nodes) == 2
    job.wait_finished()
    job.assert_same_training(reference_model(tmp_path.parent, 40))


def test_reclaim_drains_at_a_boundary_and_releases_the_nodes(
    elastic_jobs: list[ElasticSlurmJob], tmp_path: Path
) -> None:
    job = submit_core(tmp_path / "reclaim", nodes="4", steps=40, pause=0.3)
    elastic_jobs.append(job)
    job.wait_step(6)
    batch_host = job.info().batch_host
    env = job_env(job.root)
    cmd = [sys.executable, "-m", "slurm_elastic", "reclaim", "--job", job.job_id, "--nodes", "2", "--timeout", "120"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    info = job.info()
    assert len(info.nodes) == 2 and batch_host in info.nodes  # released through Slurm, batch host kept
    changes = job.of(MembershipChange)
    assert changes[-1].cause == "drain" and changes[-1].boundary_step is not None
    assert not job.of(Recovered)  # nothing aborted, nothing re-run
    # The released nodes' agents were still there when the shrink came: Slurm ended them (none exited by
    # itself as the kill arrived, which can leave slurmstepd hanging until Slurm drains the node).
    released = {"n1", "n2", "n3", "n4"} - set(info.nodes)
    assert released <= {e.node for e in job.of(NodeLost)}  # reclaim waited for them to end
    job.wait_finished()
    killed = [line for line in job.output().splitlines() if line.startswith("srun: error: ") and "Killed" in line]
    assert {line.split()[2].rstrip(":") for line in killed} == released, killed
    job.assert_same_training(reference_model(tmp_path.parent, 40))


def test_a_suspended_and_resumed_job_evicts_no_one(elastic_jobs: list[ElasticSlurmJob], tmp_path: Path) -> None:
    job = submit_core(tmp_path / "suspend", nodes="4", steps=40, pause=0.3)
    elastic_jobs.append(job)
    job.wait_step(6)
    subprocess.run(["scontrol", "suspend", job.job_id], check=True, timeout=30)
    time.sleep(12)  # SIGSTOP of every process of the job, batch host included, for more than two leases (5 s)
    subprocess.run(["scontrol", "resume", job.job_id], check=True, timeout=30)
    job.wait_finished()
    assert job.worlds() == [4], "nobody was evicted or lost"
    assert not job.of(NodeUnresponsive) and not job.of(HangEvicted) and not job.of(NodeLost)
    job.assert_same_training(reference_model(tmp_path.parent, 40))


def test_every_holder_lost_restarts_the_workers_from_the_latest_checkpoint(
    elastic_jobs: list[ElasticSlurmJob], tmp_path: Path
) -> None:
    """Every worker SIGKILLed in the same step, so no peer holds the state: through the sbatch template as
    on the local launcher, the agents start them again and they resume from the periodic checkpoint."""
    plan = FaultPlan()
    for node in ("n1", "n2", "n3", "n4"):
        plan = plan.kill(node, step=15, phase="backward")  # incarnation 0 only: the restarted ones live
    restarts = {"SLURM_ELASTIC_MAX_RESTARTS": "2"}
    job = submit_core(tmp_path / "fallback", nodes="4", steps=40, pause=0.3, env={**plan.to_env(), **restarts})
    elastic_jobs.append(job)
    job.wait_finished(hurry=False)  # at the pace of a job whose nodes are all there before step 15
    (fallback,) = job.of(CheckpointFallback)
    assert fallback.resume_step == 10 and fallback.last_committed_step == 14  # a checkpoint every 10
    assert job.of(RestartAll) and not job.of(JobFailed)
    job.assert_same_training(reference_model(tmp_path.parent, 40))


def test_ctrl_c_stops_at_a_step_boundary_with_a_checkpoint_says_who_and_is_never_requeued(
    elastic_jobs: list[ElasticSlurmJob], tmp_path: Path
) -> None:
    """A person's Ctrl-C reaches the launcher as SIGINT (in an interactive allocation; `scancel --signal=INT
    --batch` here): the same orderly stop as Slurm's warning, but the job is not requeued, and it says who."""
    job = submit_core(tmp_path / "ctrl-c", nodes="2", steps=40, pause=0.3)
    elastic_jobs.append(job)
    job.wait_step(5)
    subprocess.run(["scancel", "--signal=INT", "--batch", job.job_id], check=True, timeout=30)
    info = job.wait_finished(timeout=120, hurry=False)
    assert info.restart_count == 0 and info.state == "FAILED", info  # the launcher's exit status: 130
    (drain,) = job.of(DrainRequested)
    (suspended,) = job.of(JobSuspended)
    (cancelled,) = job.of(JobCancelled)
    assert drain.reason == "the user stopped it (Ctrl-C)" and cancelled.reason == "the user (Ctrl-C)"
    assert cancelled.step == suspended.step >= 5 and not job.of(JobFailed)
    assert f"stopped by the user (Ctrl-C) at step {cancelled.step}" in job.output()
    saved = list_checkpoints(job.dir / "checkpoints")
    assert saved and saved[-1][0] == cancelled.step  # resumable from where it stopped
    time.sleep(3)  # a requeue would show by now
    assert job.info().restart_count == 0 and len(job.of(SlurmJobStarted)) == 1
    # Started again by hand, it goes on from where the user stopped it, and ends as if never stopped.
    subprocess.run(["scontrol", "requeue", job.job_id], check=True, timeout=30)
    job.wait("the job to start again", lambda: len(job.of(SlurmJobStarted)) == 2, timeout=120)
    again = job.of(SlurmJobStarted)[1]
    job.wait("its first generation", lambda: any(e.time > again.time for e in job.of(GenerationReady)))
    assert next(e for e in job.of(GenerationReady) if e.time > again.time).resume_step == cancelled.step
    job.wait_finished()
    job.assert_same_training(reference_model(tmp_path.parent, 40))


def test_scancel_ends_a_running_job_for_good(elastic_jobs: list[ElasticSlurmJob], tmp_path: Path) -> None:
    """A user's cancel is not undone: the job stops (its nodes drain at a step boundary) and is not requeued."""
    job = submit_core(tmp_path / "scancel", nodes="2", steps=200, pause=0.3)
    elastic_jobs.append(job)
    job.wait_step(5)
    job.cancel()
    info = job.wait_finished(timeout=120, hurry=False)
    assert info.state == "CANCELLED" and info.restart_count == 0, info
    time.sleep(3)  # a requeue would show by now
    assert job.info().state == "CANCELLED"
