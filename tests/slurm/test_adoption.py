"""What a new user's script does, on the real cluster: it ends its own loop (a break at one boundary on
every rank, job.stop() from one), a typo in its arguments fails the job at the first start of every node,
its own torch.distributed calls follow the job's membership through a node's death, and a nanoGPT-style
script (its own sampling, float16 with its GradScaler, its own checkpoint) survives a death and a join."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slurm_elastic.eventtypes import JobFailed, JobFinished, WorkerExited, WorkerRegistered
from slurm_elastic.showcase.metrics import max_param_rel_diff
from slurm_elastic.testing.devcluster import LocalCluster

from .elastic_jobs import EXACT, TOLERANCE, ElasticSlurmJob, corpus, job_env, submit_core

pytestmark = pytest.mark.timeout(400)
HERE = Path(__file__).resolve().parents[1] / "integration"
MISUSE, TORCHWORLD = HERE / "misuse_script.py", HERE / "torchworld_script.py"
GPT, GPT_GATED = HERE.parent.parent / "examples" / "gpt_elastic.py", HERE / "gpt_gated.py"


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


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("lengths", r"the workers' training loops differ: total_steps 2[01] on n\d:0:0, 2[01] on n\d:0:0"),
        (
            "disagree",
            r"the loop of n\d:0:0 at step 3 \(job.micro_batches\(\) left at step 3\) ended, but n\d:0:0 went on",
        ),
        ("save_mid", r"job.save\(\) called during step 3, after its first job.backward\(\): save between"),
    ],
)
def test_loops_that_disagree_or_misuse_the_job_fail_it_naming_the_cause(
    elastic_jobs: list[ElasticSlurmJob], tmp_path: Path, mode: str, error: str
) -> None:
    command = [sys.executable, str(MISUSE), "--mode", mode]
    job = submit_core(tmp_path / mode, nodes="2", steps=0, pause=0, command=command)
    elastic_jobs.append(job)
    info = job.wait_finished(hurry=False)
    assert info.state == "FAILED", info.state
    (failed,) = job.of(JobFailed)
    assert re.search(error, failed.reason) or re.search(error, job.output()), failed.reason
    assert "all members lost" not in failed.reason and not job.of(JobFinished)


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
    job.wait("every rank at the gate", lambda: job.output().count("at gate 6\n") == 3, timeout=180)
    slurm_cluster.kill_node("n3")
    job.wait("the job to shrink", lambda: job.worlds()[-1:] == [2], timeout=60)
    gate.touch()
    info = job.wait_finished(hurry=False)
    out = job.output()
    assert info.state == "COMPLETED", f"{info.state}\n{out[-3000:]}"
    lines = [line.split() for line in out.splitlines() if line.startswith("world ")]
    for _, step, rank, world, dist_rank, dist_world, metric in lines:
        assert (rank, world) == (dist_rank, dist_world) and float(metric) == float(world), (step, rank, world)
    assert {int(line[3]) for line in lines} == {2, 3}
    assert torch.load(root / "own.pt")["step"] == 12


def gpt_command(script: Path, data: Path, out: Path) -> list[str]:
    args = ["--data", str(data), "--out-dir", str(out), "--max-iters", "20", "--eval-interval", "10"]
    return [sys.executable, str(script), *args, "--eval-iters", "2", "--always-save-checkpoint", "--dtype", "float16"]


def test_the_gpt_script_survives_a_node_death_and_a_join(
    slurm_cluster: LocalCluster, elastic_jobs: list[ElasticSlurmJob], tmp_path: Path
) -> None:
    data, root = corpus(tmp_path.parent), tmp_path / "gpt"
    alone = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")} | {"OMP_NUM_THREADS": "1", **EXACT}
    reference = tmp_path / "reference"  # one process, uninterrupted
    subprocess.run(gpt_command(GPT, data, reference), env=alone, check=True, timeout=300, capture_output=True)
    gate = root / "gate"
    job = submit_core(root, nodes="3", steps=21, pause=0, env={"SE_TEST_GATE": f"12:{gate}"},
                      command=gpt_command(GPT_GATED, data, root / "own"))  # fmt: skip
    elastic_jobs.append(job)
    job.wait_step(5)
    slurm_cluster.kill_node("n3")
    job.wait("the job to shrink", lambda: job.worlds()[-1:] == [2], timeout=60)
    grow = [sys.executable, "-m", "slurm_elastic", "grow", "--nodes", "1", "--job", job.job_id]
    done = subprocess.run(grow, env=job_env(job.root), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    job.wait("the satellite's worker", lambda: any(e.node == "n4" for e in job.of(WorkerRegistered)), timeout=180)
    gate.touch()  # the members run on; the joiner joins at the next step boundary
    info = job.wait_finished(hurry=False)
    assert info.state == "COMPLETED", f"{info.state}\n{job.output()[-3000:]}"
    assert job.worlds() == [3, 2, 3]
    report = job.ledger()
    assert (report.committed_steps, report.duplicate_samples, report.skipped_samples) == (21, 0, 0)
    got, want = (torch.load(d / "ckpt.pt", weights_only=True) for d in (root / "own", reference))
    assert got["iter_num"] == want["iter_num"] == 20
    assert max_param_rel_diff(got["model"], want["model"]) <= TOLERANCE
