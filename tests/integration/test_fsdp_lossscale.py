"""float16's gradient scaler with a `fully_shard` (FSDP2) model, ranks as threads around a real coordinator:
each rank unscales its own gradient shard, and a step whose gradients overflowed on any shard is skipped on
every rank alike, the scale backing off the same everywhere. The data holds one poisoned sample (an inf
target in its second dimension) in step 2; the scale then grows back after four clean steps. In a deep model
the inf reaches every gradient; in a single layer only its second row's, so only the ranks holding that
row see it first hand. Through a rank's death, a join and a snapshot the
job ends with the same model and scale as the same training unsharded in one process."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from slurm_elastic.ledger import analyze
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance
from slurm_elastic.testing.threadranks import GroupFault, RankResult, ThreadJob
from slurm_elastic.worker import ElasticJob
from slurm_elastic.worker.env import WorkerEnv, worker_env
from slurm_elastic.worker.ports import Ports
from slurm_elastic.worker.sharded.mesh import placeholder_mesh

pytestmark = pytest.mark.timeout(120)

STEPS, GLOBAL_BATCH, MICRO_BATCH = 8, 12, 2
POISONED = 15  # a sample of step 2 (positions 12..23, in order)
INIT_SCALE = 2.0**10


def dataset() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    data = [(torch.randn(6, generator=g), torch.randn(2, generator=g)) for _ in range(GLOBAL_BATCH * STEPS)]
    x, y = data[POISONED]
    data[POISONED] = (x, torch.tensor([y[0].item(), float("inf")]))
    return data


DATA = dataset()


def model(shard: bool, deep: bool = True) -> nn.Module:
    """Deep: 16, 7 and 2 rows (uneven shards, and empty ones at 3 ranks); else one layer of 2 rows."""
    g = torch.Generator().manual_seed(3)
    layers = [nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 7), nn.Tanh(), nn.Linear(7, 2)] if deep else [nn.Linear(6, 2)]
    net = nn.Sequential(*layers)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    if shard:
        mesh = placeholder_mesh()
        for layer in net[::2]:
            fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
    return net


def build(net: nn.Module, env: WorkerEnv, ports: Ports, **kwargs: Any) -> tuple[ElasticJob, torch.amp.GradScaler]:
    amp = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=4)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    job = ElasticJob(
        net, opt, dataset=DATA, shuffle=False, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH, scaler=amp,
        clip_grad_norm=1.0, env=env, ports=ports, **kwargs,
    )  # fmt: skip
    return job, amp


def loss_of(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(net(x), y)


def trainer(
    gate: Callable[[int], None] | None = None,
    steps: int = STEPS,
    save_to: Path | None = None,
    deep: bool = True,
    **kwargs: Any,
) -> Callable[[WorkerEnv, Ports], dict[str, Any]]:
    def train(env: WorkerEnv, ports: Ports) -> dict[str, Any]:
        net = model(shard=True, deep=deep)
        job, amp = build(net, env, ports, **kwargs)
        scales: dict[int, dict[str, Any]] = {}  # the scaler's whole state after each committed step
        job.on_step(lambda step, loss: scales.update({step: amp.state_dict()}))
        for step in job.steps(steps):
            if gate is not None:
                gate(step.number)
            for x, y in step.micro_batches():
                step.backward(amp.scale(loss_of(net, x, y)))  # the script's own call: the job scales once
        if save_to is not None:
            job.save(save_to)  # on every rank: each writes its shard
        full = {str(i): p.full_tensor().detach().clone() for i, p in enumerate(net.parameters())}  # type: ignore[attr-defined]
        return {"params": full, "scale": amp.get_scale(), "scales": scales, "world": job.world_size}

    return train


@functools.cache
def reference(deep: bool = True) -> dict[str, Any]:
    """The same training, unsharded, in one process (float32 sums in another order)."""
    net = model(shard=False, deep=deep)
    job, amp = build(net, worker_env({"SLURM_ELASTIC_REDUCE_DTYPE": "float32"}), Ports(process_hooks=False))
    scales: dict[int, dict[str, Any]] = {}
    job.on_step(lambda step, loss: scales.update({step: amp.state_dict()}))
    for x, y in job.micro_batches(STEPS):
        job.backward(loss_of(net, x, y))
    params = {str(i): p.detach().clone() for i, p in enumerate(net.parameters())}
    return {"params": params, "scale": amp.get_scale(), "scales": scales}


REFERENCE = reference()


def assert_reference(results: dict[str, RankResult], world: int, deep: bool = True) -> None:
    want = reference(deep)
    for r in results.values():
        assert r.error is None, f"{r.worker}: {r.error!r}"
    done = [r.value for r in results.values() if r.value is not None]
    assert len(done) == world and all(v["world"] == world for v in done)
    for v in done:
        assert v["scale"] == want["scale"]
        assert all(v["scales"][s] == want["scales"][s] for s in v["scales"]), (v["scales"], want)
        assert max_param_rel_diff(v["params"], want["params"]) <= tolerance("float32", STEPS)


@pytest.mark.parametrize("deep", [True, False])
def test_the_reference_skipped_the_poisoned_step_and_grew_the_scale_back(deep: bool) -> None:
    scales = reference(deep)["scales"]
    assert scales[1]["scale"] == INIT_SCALE and scales[2]["scale"] == INIT_SCALE / 2  # step 2 skipped
    assert scales[6]["scale"] == INIT_SCALE  # four clean steps (3 to 6) doubled it again
    assert all(torch.isfinite(p).all() for p in reference(deep)["params"].values())


def test_a_shard_without_the_inf_skips_the_step_with_the_shard_that_had_it(tmp_path: Path) -> None:
    # One layer of 2 rows over 3 ranks: rank 0 holds row 0 (finite), rank 1 row 1 (the inf), rank 2 none.
    job = ThreadJob(trainer(deep=False), nodes=3, reduce_dtype="float32", ledger_dir=tmp_path)
    assert_reference(job.run(), world=3, deep=False)


def test_every_rank_skips_alike_and_a_death_keeps_the_scale(tmp_path: Path) -> None:
    faults = [GroupFault("t3:0:0", 1, 4, "die")]
    job = ThreadJob(trainer(), nodes=3, faults=faults, reduce_dtype="float32", ledger_dir=tmp_path)
    results = job.run()
    assert results["t3:0:0"].died
    assert_reference({k: v for k, v in results.items() if k != "t3:0:0"}, world=2)
    ledger = analyze(tmp_path)
    assert (ledger.committed_steps, ledger.duplicate_samples, ledger.skipped_samples) == (STEPS, 0, 0)


def test_a_joiner_takes_the_scale_with_its_shards(tmp_path: Path) -> None:
    release = threading.Event()
    job = ThreadJob(
        trainer(gate=lambda step: release.wait(30) if step == 4 else None),
        nodes=2,
        reduce_dtype="float32",
        ledger_dir=tmp_path,
    ).start()
    try:
        job.wait_step(3)
        joiner = job.add_rank()
        deadline = time.monotonic() + 30
        while joiner not in job.coordinator.status().pending:
            assert time.monotonic() < deadline, "the joiner never registered"
            time.sleep(0.01)
        release.set()
        results = job.join()
    finally:
        release.set()
        job.stop()
    assert_reference(results, world=3)
    assert results[joiner].value is not None and min(results[joiner].value["scales"]) >= 4


def test_a_snapshot_keeps_the_scale(tmp_path: Path) -> None:
    snapshot = tmp_path / "snapshot"
    first = ThreadJob(trainer(steps=4, save_to=snapshot), nodes=2, reduce_dtype="float32").run()
    assert all(r.value is not None and r.value["scale"] == INIT_SCALE / 2 for r in first.values())
    second = ThreadJob(trainer(resume_from=snapshot), nodes=3, reduce_dtype="float32").run()
    assert_reference(second, world=3)
    assert all(r.value is not None and min(r.value["scales"]) == 5 for r in second.values())
