"""Recovery logic with ranks as threads of this process (testing.threadranks): a real coordinator, real gloo
groups and state transfers, a group wrapper that fails a chosen collective. Every branch of the worker's
"what next" reducer and every way a worker ends, in seconds each. Exact mode: every rank ends with the same
bits as its peers, and within the exact mode's 1e-6 of the same training in one process (float64 sums of
the same micro-batches grouped by rank differ from the one-process sum in the last float64 bits only)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from slurm_elastic.decide import membership as m
from slurm_elastic.decide import worker as decide
from slurm_elastic.eventtypes import GenerationReady, of_kind
from slurm_elastic.ledger import analyze
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance
from slurm_elastic.testing.threadranks import GroupFault, RankResult, ThreadJob
from slurm_elastic.worker import ElasticJob
from slurm_elastic.worker.env import WorkerEnv, worker_env
from slurm_elastic.worker.ports import Ports

pytestmark = pytest.mark.timeout(120)

STEPS = 8
GLOBAL_BATCH, MICRO_BATCH = 12, 2  # 6 micro-batches a step: 2 each at world 3, 3 each at world 2


def dataset() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(6, generator=g), torch.randn(2, generator=g)) for _ in range(96)]


DATA = dataset()


def model() -> nn.Module:
    g = torch.Generator().manual_seed(3)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return net


def trainer(steps: int = STEPS, gate: Callable[[int], None] | None = None) -> Callable[[WorkerEnv, Ports], Any]:
    """train(env, ports) for ThreadJob: the final parameters (and the rank it ended on)."""

    def train(env: WorkerEnv, ports: Ports) -> dict[str, Any]:
        net = model()
        opt = torch.optim.AdamW(net.parameters(), lr=0.01)
        job = ElasticJob(
            net, opt, dataset=DATA, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH, env=env, ports=ports,
            bucket_mb=0.0005,  # several buckets per step
        )  # fmt: skip
        for step in job.steps(steps):
            if gate is not None:
                gate(step.number)
            for x, y in step.micro_batches():
                step.backward(nn.functional.mse_loss(net(x), y))
        return {"params": [p.detach().clone() for p in net.parameters()], "world": job.world_size}

    return train


def reference(steps: int = STEPS) -> list[torch.Tensor]:
    """The same training in this one process, standalone (no coordinator)."""
    env = worker_env({"SLURM_ELASTIC_REDUCE_DTYPE": "float64"})
    return trainer(steps)(env, Ports(process_hooks=False))["params"]  # type: ignore[no-any-return]


REFERENCE = reference()


def finished(results: dict[str, RankResult]) -> list[RankResult]:
    for r in results.values():
        assert r.error is None, f"{r.worker}: {r.error!r}"
    return [r for r in results.values() if r.value is not None]


def assert_reference(results: dict[str, RankResult], world: int) -> None:
    done = finished(results)
    assert len(done) == world and all(r.value["world"] == world for r in done)
    first = done[0].value["params"]
    for r in done:
        assert all(torch.equal(a, b) for a, b in zip(r.value["params"], first, strict=True)), "replicas differ"
    got = {str(i): t for i, t in enumerate(first)}
    assert max_param_rel_diff(got, {str(i): t for i, t in enumerate(REFERENCE)}) <= tolerance("float64", STEPS)


def test_no_fault_gives_the_one_process_bits() -> None:
    assert_reference(ThreadJob(trainer(), nodes=3).run(), world=3)


def test_a_collective_that_raises_re_forms_the_same_members(tmp_path: Path) -> None:
    # t2's 4th collective of generation 1 fails (a broken connection): it asks for a new generation.
    job = ThreadJob(trainer(), nodes=3, faults=[GroupFault("t2:0:0", 1, 4, "raise")], ledger_dir=tmp_path)
    results = job.run()
    assert_reference(results, world=3)
    ledger = analyze(tmp_path)
    assert (ledger.committed_steps, ledger.duplicate_samples, ledger.skipped_samples) == (STEPS, 0, 0)


def test_a_rank_dying_mid_step_is_recovered_and_the_step_re_run(tmp_path: Path) -> None:
    job = ThreadJob(trainer(), nodes=3, faults=[GroupFault("t3:0:0", 1, 6, "die")], ledger_dir=tmp_path)
    results = job.run()
    assert results["t3:0:0"].died
    assert_reference(results, world=2)
    assert analyze(tmp_path).duplicate_samples == 0 == analyze(tmp_path).skipped_samples


def test_a_rank_dying_once_its_sums_completed_loses_no_committed_step(tmp_path: Path) -> None:
    # t1 dies once the last bucket of step 2 is summed: the others commit step 2 with its samples in it.
    nth = 1 + 2 * bucket_count()  # the start-up allgather, then step 1's and step 2's buckets
    job = ThreadJob(trainer(), nodes=3, faults=[GroupFault("t1:0:0", 1, nth, "die_after")], ledger_dir=tmp_path)
    results = job.run()
    assert results["t1:0:0"].died
    assert_reference(results, world=2)
    ledger = analyze(tmp_path)
    assert (ledger.committed_steps, ledger.steps_committed_twice, ledger.duplicate_samples) == (STEPS, 0, 0)
    ready = of_kind(job.coordinator.coordinator.events.recent(50), GenerationReady)
    assert ready[-1].generation == 2 and ready[-1].resume_step == 2, "step 2 was kept, not re-run"


def bucket_count() -> int:
    from slurm_elastic.worker.replicated.reduction import GradientReducer

    red = GradientReducer(list(model().parameters()), "float64", bucket_mb=0.0005)
    red.close()
    return red.bucket_count


def test_a_joiner_crosses_a_boundary_and_heals_from_peers() -> None:
    release = threading.Event()

    def gate(step: int) -> None:
        if step == 4:
            release.wait(30)  # hold step 4 until the joiner has registered

    job = ThreadJob(trainer(gate=gate), nodes=2).start()
    try:
        job.wait_step(3)
        job.add_rank()
        _wait(lambda: job.coordinator.status().pending != [])
        release.set()
        results = job.join()
    finally:
        job.stop()
    assert_reference(results, world=3)
    assert job.coordinator.view().world == 3


def test_a_drained_rank_leaves_at_a_boundary_with_exit_code_0() -> None:
    release = threading.Event()
    job = ThreadJob(trainer(gate=lambda step: release.wait(30) if step == 4 else None), nodes=3).start()
    try:
        job.wait_step(3)
        job.coordinator.drain(["t2"], "boundary", "reclaim")
        release.set()
        results = job.join()
    finally:
        job.stop()
    assert (results["t2:0:0"].ending, results["t2:0:0"].code) == ("left", decide.EXIT_OK)
    assert_reference({k: v for k, v in results.items() if k != "t2:0:0"}, world=2)


def test_a_failed_job_ends_every_rank_with_exit_code_1() -> None:
    release = threading.Event()
    job = ThreadJob(trainer(gate=lambda step: release.wait(30) if step == 3 else None), nodes=2).start()
    try:
        job.wait_step(2)
        job.coordinator.call(job.coordinator.coordinator.driver.feed, m.Abort("an operator gave up"))
        release.set()
        results = job.join()
    finally:
        job.stop()
    assert {(r.ending, r.code) for r in results.values()} == {("job_failed", decide.EXIT_JOB_FAILED)}


def test_a_lost_coordinator_ends_every_rank_with_exit_code_3() -> None:
    release = threading.Event()
    job = ThreadJob(trainer(gate=lambda step: release.wait(30) if step == 3 else None), nodes=2).start()
    try:
        job.wait_step(2)
        job.stop()
        release.set()
        results = job.join()
    finally:
        job.stop()
    assert {(r.ending, r.code) for r in results.values()} == {("coordinator_lost", decide.EXIT_COORDINATOR_LOST)}


def test_a_rank_registering_after_the_end_is_turned_away() -> None:
    job = ThreadJob(trainer(steps=2), nodes=2).start()
    try:
        job.join()
        late = job.add_rank()
        results = job.join()
    finally:
        job.stop()
    assert (results[late].ending, results[late].code) == ("job_over", decide.EXIT_OK)


def _wait(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)
