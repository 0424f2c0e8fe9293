"""FSDP2 (`fully_shard`) through `elastic_core.sbatch` on the real local Slurm cluster: a node dies (its slurmd,
steps and tasks SIGKILLed at once), the survivors re-shard from each other's memory without losing a committed
step, the node comes back and the worker the job starts there takes its shards from peers. The job ends with
the model of the same script run uninterrupted (within float32's tolerance), every sample used once."""

from __future__ import annotations

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
STEPS, GLOBAL_BATCH, GATE_STEP = 24, 12, 16


def command(out: Path, pause: float) -> list[str]:
    args = ["--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH), "--pause", str(pause)]
    return [sys.executable, str(SCRIPT), *args, "--save", str(out / "model.pt")]


def reference(root: Path) -> dict[str, torch.Tensor]:
    """The uninterrupted run: the same script on 4 local ranks, no Slurm, no fault."""
    out = root / "fsdp-reference"
    job = LocalJob(command(out, 0.0), JobConfig(nodes=4, max_restarts=0), root=out, log_dir=out / "logs")
    job.start()
    try:
        result = job.wait(timeout=150)
    finally:
        job.stop()
    assert result.ok, f"{result.phase}: {result.reason}"
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
