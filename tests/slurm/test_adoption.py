"""What a new user's script does, on the real cluster: it ends its own loop (a break at one boundary on
every rank, job.stop() from one), a typo in its arguments fails the job at the first start of every node,
and its own torch.distributed calls follow the job's membership through a node's death."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from slurm_elastic.eventtypes import JobFailed, JobFinished, MembershipChange, WorkerExited
from slurm_elastic.testing.devcluster import LocalCluster

from .elastic_jobs import ElasticSlurmJob, submit_core

pytestmark = pytest.mark.timeout(400)
HERE = Path(__file__).resolve().parents[1] / "integration"
MISUSE, TORCHWORLD = HERE / "misuse_script.py", HERE / "torchworld_script.py"


@pytest.mark.parametrize("mode", ["leave", "stop"])
def test_a_loop_every_rank_leaves_at_one_boundary_completes_the_job(
    elastic_jobs: list[ElasticSlurmJob], tmp_path: Path, mode: str
) -> None:
    command = [sys.executable, str(MISUSE), "--mode", mode]
    job = submit_core(tmp_path / mode, nodes="2", steps=0, pause=0, command=command)
    elastic_jobs.append(job)
    info = job.wait_finished(hurry=False)
    out = job.output()
    assert info.state == "COMPLETED", f"{info.state}\n{out[-3000:]}"
    ends = re.findall(r"after the loop at step (\d+), rank (\d) of 2", out)
    assert sorted(rank for _, rank in ends) == ["0", "1"] and len({s for s, _ in ends}) == 1, ends
    (finished,) = job.of(JobFinished)
    assert ("enough for this test" if mode == "stop" else "left at step 3") in finished.reason


def test_a_typo_in_the_scripts_arguments_fails_the_job_at_the_first_start_of_every_node(
    elastic_jobs: list[ElasticSlurmJob], tmp_path: Path
) -> None:
    command = [sys.executable, str(MISUSE), "--mode", "brake"]
    job = submit_core(tmp_path / "typo", nodes="2", steps=0, pause=0, command=command)
    elastic_jobs.append(job)
    info = job.wait_finished(hurry=False)
    assert info.state == "FAILED", info.state
    (failed,) = job.of(JobFailed)
    assert "exited with 2 on every node without joining the job" in failed.reason, failed.reason
    assert "invalid choice: 'brake'" in failed.reason, failed.reason
    assert len(job.of(WorkerExited)) <= 4, "each node's first start, and at most one restart begun meanwhile"


def test_the_scripts_own_torch_distributed_calls_follow_a_node_death(
    slurm_cluster: LocalCluster, elastic_jobs: list[ElasticSlurmJob], tmp_path: Path
) -> None:
    root = tmp_path / "torchworld"
    gate = root / "gate"
    command = [sys.executable, str(TORCHWORLD), "--steps", "12", "--save", str(root / "own.pt"), "--gates", f"6:{gate}"]
    job = submit_core(root, nodes="3", steps=12, pause=0, command=command)
    elastic_jobs.append(job)
    job.wait("step 5", lambda: "world 5 " in job.output(), timeout=180)
    slurm_cluster.kill_node("n3")
    job.wait("the job to shrink", lambda: [e.world for e in job.of(MembershipChange)][-1:] == [2], timeout=60)
    gate.touch()
    info = job.wait_finished(hurry=False)
    out = job.output()
    assert info.state == "COMPLETED", f"{info.state}\n{out[-3000:]}"
    lines = [line.split() for line in out.splitlines() if line.startswith("world ")]
    for _, step, rank, world, dist_rank, dist_world, metric in lines:
        assert (rank, world) == (dist_rank, dist_world) and float(metric) == float(world), (step, rank, world)
    assert {int(line[3]) for line in lines} == {2, 3}
    assert torch.load(root / "own.pt")["step"] == 12
