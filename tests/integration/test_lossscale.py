"""float16's gradient scaler under the job (`scaler=`, worker.lossscale), on CPU: the job scales the loss,
unscales the summed gradients before clipping, skips a step whose gradients overflowed on every rank alike,
and carries the scale through a rank's death, a join and a snapshot. Ranks are threads around a real
coordinator; the data holds one poisoned sample (an inf) that overflows step 2's gradients."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from slurm_elastic.ledger import analyze
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance
from slurm_elastic.testing.threadranks import GroupFault, ThreadJob
from slurm_elastic.worker import ElasticJob
from slurm_elastic.worker.env import WorkerEnv, worker_env
from slurm_elastic.worker.ports import Ports

pytestmark = pytest.mark.timeout(120)

STEPS, GLOBAL_BATCH, MICRO_BATCH = 8, 12, 2
POISONED = 15  # a sample of step 2 (positions 12..23, in order)
INIT_SCALE = 2.0**10


def dataset() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    data = [(torch.randn(6, generator=g), torch.randn(2, generator=g)) for _ in range(GLOBAL_BATCH * STEPS)]
    data[POISONED] = (torch.full((6,), float("inf")), data[POISONED][1])
    return data


DATA = dataset()


def model() -> nn.Module:
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    g = torch.Generator().manual_seed(3)  # not torch's global generator, which the rank threads share
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return net


def build(env: WorkerEnv, ports: Ports, *, scaler: bool = True, **kwargs: Any) -> tuple[nn.Module, ElasticJob, Any]:
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    amp = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=4) if scaler else None
    job = ElasticJob(
        net, opt, dataset=DATA, shuffle=False, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH, scaler=amp,
        clip_grad_norm=1.0, env=env, ports=ports, **kwargs,
    )  # fmt: skip
    return net, job, amp


def alone() -> tuple[WorkerEnv, Ports]:
    return worker_env({"SLURM_ELASTIC_REDUCE_DTYPE": "float64"}), Ports(process_hooks=False)


def params(net: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def loss_of(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(net(x), y)


def trainer(gate: threading.Event | None = None, script_calls: bool = False) -> Any:
    def train(env: WorkerEnv, ports: Ports) -> dict[str, Any]:
        net, job, amp = build(env, ports)
        scales: dict[int, dict[str, Any]] = {}  # the scaler's whole state (scale, growth tracker) after each step
        job.on_step(lambda step, loss: scales.update({step: amp.state_dict()}))
        for step in job.steps(STEPS):
            if gate is not None and job.step == 4:
                gate.wait(30)
            for x, y in step.micro_batches():
                step.backward(amp.scale(loss_of(net, x, y)) if script_calls else loss_of(net, x, y))
            if script_calls:  # the script's own AMP recipe, kept: the job does each of these once, itself
                amp.unscale_(job.optimizer)
                amp.step(job.optimizer)
                amp.update()
        return {"params": params(net), "scale": amp.get_scale(), "scales": scales, "world": job.world_size}

    return train


def reference() -> dict[str, Any]:
    net, job, amp = build(*alone())
    for x, y in job.micro_batches(STEPS):
        job.backward(loss_of(net, x, y))
    return {"params": params(net), "scale": amp.get_scale()}


REFERENCE = reference()


def same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    """Within the exact mode's bound: float64 sums grouped by rank round to the same float32 but rarely."""
    return max_param_rel_diff(got, want) <= tolerance("float64", STEPS)


def test_the_overflowing_step_is_skipped_and_the_scale_backs_off_then_grows() -> None:
    assert all(torch.isfinite(p).all() for p in REFERENCE["params"].values()), "the inf never reached the model"
    # Step 2 overflowed (scale halved); steps 3 to 6, four good ones (growth_interval=4), doubled it again.
    assert REFERENCE["scale"] == INIT_SCALE
    net, job, _ = build(*alone(), scaler=False)
    for x, y in job.micro_batches(STEPS):
        job.backward(loss_of(net, x, y))
    assert not all(torch.isfinite(p).all() for p in net.parameters()), "without the scaler the inf ruins it"


def test_ranks_skip_alike_and_the_scale_survives_a_death(tmp_path: Path) -> None:
    job = ThreadJob(trainer(), nodes=3, faults=[GroupFault("t3:0:0", 1, 4, "die")], ledger_dir=tmp_path)
    results = job.run()
    assert results["t3:0:0"].died
    done = [r.value for r in results.values() if r.value is not None]
    assert len(done) == 2 and all(v["world"] == 2 for v in done)
    for v in done:
        assert v["scale"] == REFERENCE["scale"] and same(v["params"], REFERENCE["params"])
    ledger = analyze(tmp_path)
    assert (ledger.committed_steps, ledger.duplicate_samples, ledger.skipped_samples) == (STEPS, 0, 0)


def test_a_joiner_receives_the_scale_and_the_scripts_own_scaler_calls_change_nothing() -> None:
    gate = threading.Event()
    job = ThreadJob(trainer(gate, script_calls=True), nodes=2).start()
    try:
        job.wait_step(3)
        joiner = job.add_rank()
        deadline = time.monotonic() + 30
        while joiner not in (status := job.coordinator.status()).pending and status.world_size < 3:
            assert time.monotonic() < deadline, "the joiner never registered"
            time.sleep(0.01)
        gate.set()
        results = job.join()
    finally:
        gate.set()
        job.stop()
    assert all(r.error is None for r in results.values()), [r.error for r in results.values()]
    assert results[joiner].value["world"] == 3
    first, late = results["t1:0:0"].value["scales"], results[joiner].value["scales"]
    assert late and all(late[step] == first[step] for step in late), (first, late)
    for r in results.values():
        assert r.value["scale"] == REFERENCE["scale"] and same(r.value["params"], REFERENCE["params"])


def test_a_snapshot_keeps_the_scale(tmp_path: Path) -> None:
    net, job, amp = build(*alone())
    for x, y in job.micro_batches(3):
        job.backward(loss_of(net, x, y))
    job.save(tmp_path / "snap.pt")
    saved = amp.get_scale()
    assert saved == INIT_SCALE / 2, "step 2 halved it"
    _net, resumed, again = build(*alone(), resume_from=tmp_path / "snap.pt")
    assert resumed.step == 3  # joins: the snapshot is loaded
    assert again.get_scale() == saved != INIT_SCALE
