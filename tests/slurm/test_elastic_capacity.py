"""Capacity that comes and goes: satellites that join, are preempted and come back; growth into freed
nodes; the whole job preempted or its batch host lost, then resumed from a disaster-recovery checkpoint."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.eventtypes import (
    GenerationReady,
    JobSuspended,
    MembershipChange,
    NodeRegistered,
    Recovered,
    SlurmJobStarted,
)
from slurm_elastic.slurm import CliBackend
from slurm_elastic.testing.devcluster import LocalCluster

from .elastic_jobs import ElasticSlurmJob, job_env, reference_model, submit_core

pytestmark = pytest.mark.timeout(500)


@pytest.fixture
def cleanup(slurm_cluster: LocalCluster) -> Iterator[list[str]]:
    """Job ids to cancel at the end; nodes a test killed are restarted."""
    ids: list[str] = []
    yield ids
    subprocess.run(["scancel", *ids], check=False, timeout=30)
    for node in slurm_cluster.nodes:
        if slurm_cluster.node_states().get(node, "").startswith("down"):
            slurm_cluster.restart_node(node)
    slurm_cluster.wait_nodes(slurm_cluster.nodes, want_idle=True, timeout_s=180)


def quiet_cluster(cluster: LocalCluster) -> None:
    """Every node idle and nothing queued, so that a job asking for 2-4 nodes gets all 4."""
    deadline = time.monotonic() + 120
    while subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=30).stdout.strip():
        assert time.monotonic() < deadline, "the queue did not empty"
        time.sleep(0.5)
    cluster.wait_nodes(cluster.nodes, want_idle=True, timeout_s=120)


def elastic(job: ElasticSlurmJob, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "slurm_elastic", *args, "--job", job.job_id]
    done = subprocess.run(cmd, env=job_env(job.root), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def sbatch(*args: str) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", "--output=/dev/null", *args], check=True, capture_output=True, text=True, timeout=30
    )
    return out.stdout.strip().split(";")[0]


def satellites(job: ElasticSlurmJob) -> list[str]:
    return [j.job_id for j in CliBackend().jobs(name=f"se-sat-{job.job_id}")]


def test_preempted_satellite_leaves_cleanly_and_rejoins(cleanup: list[str], tmp_path: Path) -> None:
    job = submit_core(tmp_path / "satellite", nodes="2", steps=200, pause=0.4, sbatch_args=("--nodelist=n[1-2]",))
    cleanup.append(job.job_id)
    job.wait_step(3)
    elastic(job, "grow", "--nodes", "1", "--partition", "train")
    cleanup.extend(satellites(job))
    job.wait("the satellite to join", lambda: job.worlds()[-1:] == [3], timeout=120)
    satellite_node = next(e.node for e in job.of(NodeRegistered) if e.node not in ("n1", "n2"))
    cleanup.append(sbatch("--partition=infer", "--exclusive", f"--nodelist={satellite_node}", "--wrap=sleep 10"))
    job.wait("the satellite to drain", lambda: job.worlds()[-2:] == [3, 2], timeout=120)
    drain = job.of(MembershipChange)[-1]
    assert drain.cause == "drain" and drain.boundary_step is not None  # left at a step boundary
    assert not job.of(Recovered)  # nothing aborted, no committed step lost
    job.wait("the requeued satellite to rejoin", lambda: job.worlds()[-3:] == [3, 2, 3], timeout=180)
    assert any(CliBackend().job(s).restart_count >= 1 for s in satellites(job))
    job.wait_finished()
    job.assert_same_training(reference_model(tmp_path.parent, 200))


def test_grow_keep_pending_takes_freed_nodes(cleanup: list[str], tmp_path: Path) -> None:
    blocker = sbatch("--partition=train", "--exclusive", "--nodes=2", "--nodelist=n[3-4]", "--wrap=sleep 600")
    cleanup.append(blocker)
    job = submit_core(tmp_path / "grow", nodes="2", steps=150, pause=0.4, sbatch_args=("--nodelist=n[1-2]",))
    cleanup.append(job.job_id)
    job.wait_step(3)
    elastic(job, "grow", "--nodes", "1", "--keep-pending")
    pending = lambda: [s for s in satellites(job) if CliBackend().job(s).is_pending]  # noqa: E731
    job.wait("a pending satellite", lambda: len(pending()) == 1, timeout=30)
    subprocess.run(["scancel", blocker], check=True, timeout=30)
    job.wait("the freed nodes to join", lambda: job.worlds()[-1:] == [4], timeout=180)
    job.wait("one satellite pending again", lambda: len(pending()) == 1, timeout=30)
    cleanup.extend(satellites(job))
    job.wait_finished()
    job.assert_same_training(reference_model(tmp_path.parent, 150))
    assert not [s for s in satellites(job) if not CliBackend().job(s).is_finished]  # the pool ends with the job


def wait_resumed(job: ElasticSlurmJob, start_timeout: float) -> tuple[SlurmJobStarted, GenerationReady]:
    """The requeued job's second start, and the first generation it formed after it."""
    job.wait("the requeued job to resume", lambda: bool(job.of(SlurmJobStarted)[1:]), timeout=start_timeout)
    restart = job.of(SlurmJobStarted)[1]
    resumed = lambda: [e for e in job.of(GenerationReady) if e.time > restart.time]  # noqa: E731
    job.wait("the resumed job's first generation", lambda: bool(resumed()), timeout=120)
    return restart, resumed()[0]


def test_whole_job_preemption_checkpoints_requeues_and_resumes(
    slurm_cluster: LocalCluster, cleanup: list[str], tmp_path: Path
) -> None:
    quiet_cluster(slurm_cluster)
    job = submit_core(tmp_path / "preempt", nodes="4", steps=100, pause=0.3)
    cleanup.append(job.job_id)
    job.wait_step(8)
    cleanup.append(sbatch("--partition=infer", "--exclusive", "--nodelist=n4", "--wrap=sleep 40"))
    job.wait("the job to suspend", lambda: bool(job.of(JobSuspended)), timeout=60)
    suspended_at = job.of(JobSuspended)[0].step
    job.wait("the job to be requeued", lambda: job.info().is_pending, timeout=60)
    # n4 stays busy for a while: let the job resume on fewer nodes rather than wait for it.
    subprocess.run(["scontrol", "update", f"JobId={job.job_id}", "NumNodes=2-4"], check=True, timeout=30)
    restart, first = wait_resumed(job, start_timeout=180)
    assert restart.restart_count >= 1 and 2 <= len(restart.nodes) < 4 and "n4" not in restart.nodes
    assert first.resume_step == suspended_at  # the SIGTERM checkpoint: nothing lost
    assert first.world == len(restart.nodes)  # a different node count than before
    job.wait_finished()
    job.assert_same_training(reference_model(tmp_path.parent, 100))


def test_batch_host_loss_resumes_from_the_periodic_checkpoint(
    slurm_cluster: LocalCluster, cleanup: list[str], tmp_path: Path
) -> None:
    quiet_cluster(slurm_cluster)
    job = submit_core(tmp_path / "batch-host", nodes="2-4", steps=80, pause=0.3)
    cleanup.append(job.job_id)
    job.wait_step(14)
    batch_host = job.info().batch_host
    assert batch_host is not None
    slurm_cluster.kill_node(batch_host)
    restart, first = wait_resumed(job, start_timeout=240)
    assert restart.restart_count >= 1 and batch_host not in restart.nodes
    assert first.resume_step >= 10  # a periodic checkpoint (every 10 steps)
    slurm_cluster.restart_node(batch_host)
    job.wait_finished(timeout=400)
    job.assert_same_training(reference_model(tmp_path.parent, 80))
