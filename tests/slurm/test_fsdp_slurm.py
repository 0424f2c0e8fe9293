"""FSDP2 (`fully_shard`) through `elastic_core.sbatch` on the real local Slurm cluster: a node dies (its slurmd,
steps and tasks SIGKILLed at once), the survivors re-shard from each other's memory without losing a committed
step, the node comes back and the worker the job starts there takes its shards from peers. The job ends with
the model of the same script run uninterrupted (within float32's tolerance), every sample used once. A
script's own DCP checkpointer saves through a node's death, and a second job resumes from what it saved."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from slurm_elastic.config import JobConfig
from slurm_elastic.eventtypes import CheckpointFallback, GenerationReady, MembershipChange, StateLost, WorkerRegistered
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance
from slurm_elastic.testing.devcluster import LocalCluster

from .elastic_jobs import REPO, ElasticSlurmJob, submit_core

pytestmark = pytest.mark.timeout(500)

SCRIPT = REPO / "tests" / "integration" / "fsdp_script.py"
OWN_DCP = REPO / "tests" / "integration" / "torchworld_fsdp_script.py"  # with its own DCP checkpointer
STEPS, GLOBAL_BATCH, GATE_STEP = 24, 12, 16


def command(out: Path, pause: float) -> list[str]:
    args = ["--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH), "--pause", str(pause)]
    return [sys.executable, str(SCRIPT), *args, "--save", str(out / "model.pt")]


def run_locally(out: Path, argv: list[str], nodes: int) -> None:
    """The script on `nodes` local ranks, no Slurm, no fault."""
    job = LocalJob(argv, JobConfig(nodes=nodes, max_restarts=0), root=out, log_dir=out / "logs")
    job.start()
    try:
        result = job.wait(timeout=150)
    finally:
        job.stop()
    assert result.ok, f"{result.phase}: {result.reason}"


def reference(root: Path) -> dict[str, torch.Tensor]:
    """The uninterrupted run: the same script on 4 local ranks."""
    out = root / "fsdp-reference"
    run_locally(out, command(out, 0.0), nodes=4)
    return torch.load(out / "model.pt")  # type: ignore[no-any-return]


@pytest.fixture
def cluster(slurm_cluster: LocalCluster) -> Iterator[LocalCluster]:
    yield slurm_cluster
    for node in slurm_cluster.nodes:  # the node killed here comes back even when the test failed
        if slurm_cluster.node_states().get(node, "").startswith("down"):
            slurm_cluster.restart_node(node)
    slurm_cluster.wait_nodes(slurm_cluster.nodes, want_idle=True, timeout_s=120)


def ready_at(job: ElasticSlurmJob, world: int) -> list[GenerationReady]:
    return [e for e in job.of(GenerationReady) if e.world == world]


def test_fsdp_job_loses_a_node_re_shards_from_peers_and_takes_it_back(cluster: LocalCluster, tmp_path: Path) -> None:
    expected = reference(tmp_path)
    root, gate = tmp_path / "fsdp", tmp_path / "gate"
    # Every rank waits before step GATE_STEP until the gate exists: the node's new worker, which takes seconds
    # to start, joins before the job ends.
    env = {"SLURM_ELASTIC_REDUCE_DTYPE": "float32", "SE_TEST_GATE": f"{GATE_STEP}:{gate}"}
    job = submit_core(root, nodes="4", steps=STEPS, pause=0.2, env=env, command=command(root, 0.2))
    try:
        job.wait_step(4)
        killed_at = time.time()
        cluster.kill_node("n3")
        job.wait("the job to re-shard over 3 ranks", lambda: bool(ready_at(job, 3)), timeout=60)
        cluster.restart_node("n3")
        job.wait(
            "a worker on n3 to register again",
            lambda: any(e.node == "n3" and e.time > killed_at for e in job.of(WorkerRegistered)),
            timeout=120,
        )
        gate.touch()
        job.wait("n3's worker to join", lambda: bool(ready_at(job, 4)[1:]), timeout=90)
        info = job.wait_finished(hurry=False)
    finally:
        job.cancel()
    assert info.state == "COMPLETED", f"{info.state}; output:\n{job.output()[-3000:]}"
    # rows moved between survivors' memory (sources to receivers), then to the joiner; none from disk
    healed, joined = ready_at(job, 3)[0], ready_at(job, 4)[-1]
    assert healed.lost_committed_steps == 0 and healed.sources and healed.receivers, healed
    ranks = job.of(MembershipChange)[-1].ranks
    joiner = next(r for r, worker in enumerate(ranks) if worker.startswith("n3:"))
    assert joined.lost_committed_steps == 0 and joiner in joined.receivers, (joined, ranks)
    assert not job.of(CheckpointFallback) and not job.of(StateLost)
    assert max_param_rel_diff(torch.load(job.model), expected) <= tolerance("float32", STEPS)
    report = job.ledger()
    assert (report.committed_steps, report.duplicate_samples, report.skipped_samples) == (STEPS, 0, 0), report
    assert report.samples_consumed == STEPS * GLOBAL_BATCH


def own_dcp(out: Path, *args: str) -> list[str]:
    return [sys.executable, str(OWN_DCP), "--dcp", str(out / "dcp"), "--full", str(out / "full.pt"), *args]


def test_an_fsdp2_scripts_own_dcp_checkpoint_outlives_a_node_death_and_resumes_another_job(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    # The script saves its own DCP checkpoint (model and AdamW moments) after a loop that lost n3; a second
    # job, on 2 nodes, loads it before ElasticJob(...) and trains on: the model of 12 uninterrupted steps.
    env = {"SLURM_ELASTIC_REDUCE_DTYPE": "float32"}
    first_root, gate = tmp_path / "own-first", tmp_path / "own-gate"
    first = submit_core(
        first_root,
        nodes="3",
        steps=8,
        pause=0,
        env=env,
        command=own_dcp(first_root, "--steps", "8", "--gates", f"5:{gate}"),
    )
    try:
        first.wait("every rank at the gate", lambda: first.output().count("at gate 5\n") == 3, timeout=180)
        cluster.kill_node("n3")
        first.wait("the job to go on without n3", lambda: first.worlds()[-1:] == [2], timeout=60)
        gate.touch()
        info = first.wait_finished(hurry=False)
    finally:
        first.cancel()
    assert info.state == "COMPLETED", f"{info.state}; output:\n{first.output()[-3000:]}"
    assert sorted(re.findall(r"saved by rank \d of \d", first.output())) == [
        "saved by rank 0 of 2",
        "saved by rank 1 of 2",
    ]

    second_root = tmp_path / "own-second"
    resume = own_dcp(second_root, "--steps", "12", "--load", str(first_root / "dcp"), "--start-step", "8")
    second = submit_core(second_root, nodes="2", steps=12, pause=0, env=env, command=resume)
    try:
        info = second.wait_finished(hurry=False)
    finally:
        second.cancel()
    assert info.state == "COMPLETED", f"{info.state}; output:\n{second.output()[-3000:]}"
    reference_root = tmp_path / "own-reference"
    run_locally(reference_root, own_dcp(reference_root, "--steps", "12"), nodes=3)
    got, want = torch.load(second_root / "full.pt"), torch.load(reference_root / "full.pt")
    assert max_param_rel_diff(got, want) <= tolerance("float32", 12)
