"""The loop a DDP user writes, with ranks as threads (testing.threadranks) or alone: epochs and their hooks,
rank and world size before the loop, the user's own state in peer transfers and snapshots, a DataLoader's
settings, and the documented error (never a finished job) for each way the loop is misused."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, WeightedRandomSampler

from slurm_elastic.errors import ConfigError, UsageError
from slurm_elastic.eventtypes import UserFailure, of_kind
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance
from slurm_elastic.testing.threadranks import RankResult, ThreadJob
from slurm_elastic.wire.messages import StatusReply
from slurm_elastic.worker import ElasticJob, ElasticLoader
from slurm_elastic.worker.checkpoints.checkpoint import CheckpointError
from slurm_elastic.worker.env import WorkerEnv, worker_env
from slurm_elastic.worker.ports import Ports

pytestmark = pytest.mark.timeout(120)

N = 90  # samples: with 12 a step, epoch 0 ends at step 8 (cursor 96), epoch 1 at step 15 (cursor 180)
GLOBAL_BATCH, MICRO_BATCH = 12, 2


def dataset() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(6, generator=g), torch.randn(2, generator=g)) for _ in range(N)]


DATA = dataset()


def model() -> nn.Module:
    g = torch.Generator().manual_seed(3)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return net


def build(env: WorkerEnv, ports: Ports, **kwargs: Any) -> tuple[nn.Module, ElasticJob]:
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    data: dict[str, Any] = {} if "loader" in kwargs else {"dataset": DATA, "micro_batch": MICRO_BATCH}
    job = ElasticJob(net, opt, global_batch=GLOBAL_BATCH, env=env, ports=ports, **data, **kwargs)
    return net, job


def alone() -> tuple[WorkerEnv, Ports]:
    return worker_env({"SLURM_ELASTIC_REDUCE_DTYPE": "float64"}), Ports(process_hooks=False)


def params(net: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def flat(steps: int, **kwargs: Any) -> list[torch.Tensor]:
    net, job = build(*alone(), **kwargs)
    for x, y in job.micro_batches(steps):
        job.backward(nn.functional.mse_loss(net(x), y))
    return params(net)


REFERENCE_15 = flat(15)


def close_to(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    named = lambda ts: {str(i): t for i, t in enumerate(ts)}  # noqa: E731
    return max_param_rel_diff(named(got), named(want)) <= tolerance("float64", 15)


def epoch_trainer(epochs: int, gate: Callable[[int], None] | None = None) -> Callable[[WorkerEnv, Ports], Any]:
    def train(env: WorkerEnv, ports: Ports) -> dict[str, Any]:
        ema = model()  # an EMA of the weights: user state that must travel with the replica
        stats: dict[str, Any] = {"epochs_run": 0, "ema": ema}
        net, job = build(env, ports, extra_state=stats)
        identity = (job.rank, job.world_size)  # known before the loop: the first use joins the job
        assert job.global_batch == GLOBAL_BATCH
        ended: list[tuple[int, int]] = []
        job.on_epoch(lambda epoch: ended.append((epoch, job.step)))

        @job.on_step
        def update_ema(step: int, loss: float) -> None:
            with torch.no_grad():
                for e, p in zip(ema.parameters(), net.parameters(), strict=True):
                    e.mul_(0.9).add_(p, alpha=0.1)

        for epoch in job.epochs(epochs):
            assert epoch == job.epoch
            for x, y in job.micro_batches():
                if gate is not None:
                    gate(job.step + 1)
                job.backward(nn.functional.mse_loss(net(x), y))
            job.extra_state["epochs_run"] = epoch + 1
        return {
            "params": params(net),
            "ema": params(ema),
            "identity": identity,
            "ended": ended,
            "epochs_run": stats["epochs_run"],
            "epoch": job.epoch,
            "loss": job.loss,
        }

    return train


def test_an_epoch_loop_trains_the_same_samples_as_the_flat_loop_and_runs_its_hooks() -> None:
    results = ThreadJob(epoch_trainer(2), nodes=3).run()
    done = [r.value for r in results.values()]
    assert all(r.error is None for r in results.values()), [r.error for r in results.values()]
    assert sorted(v["identity"] for v in done) == [(0, 3), (1, 3), (2, 3)]
    for v in done:
        assert v["ended"] == [(0, 8), (1, 15)], "epoch e ends with the first step whose cursor reaches (e+1)*N"
        assert (v["epoch"], v["epochs_run"]) == (2, 2) and v["loss"] is not None
        assert all(torch.equal(a, b) for a, b in zip(v["params"], done[0]["params"], strict=True))
    assert close_to(done[0]["params"], REFERENCE_15), "2 epochs of 90 = 15 steps of 12, the same samples"


def arrived(status: StatusReply, worker: str) -> bool:
    return worker in status.pending or any(m.worker_id == worker and m.rank is not None for m in status.members)


def join_after_step_10(job: ThreadJob, release: threading.Event) -> tuple[str, dict[str, RankResult]]:
    """Start `job`, add a rank once step 10 is committed, `release` the members (who wait before step 11) once
    the joiner is pending or already in (members still at step 10's boundary take it in at once), and run the
    job to its end: the joiner's id and every rank's result."""
    job.start()
    try:
        job.wait_step(10)
        joiner = job.add_rank()
        deadline = time.monotonic() + 30
        while not arrived(job.coordinator.status(), joiner):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        release.set()
        return joiner, job.join()
    finally:
        job.stop()


def test_a_joiner_receives_the_user_state_and_counts_epochs_from_where_it_joins() -> None:
    release = threading.Event()
    job = ThreadJob(epoch_trainer(2, gate=lambda step: release.wait(30) if step == 11 else None), nodes=2)
    joiner, results = join_after_step_10(job, release)
    assert all(r.error is None for r in results.values()), [r.error for r in results.values()]
    first, late = results["t1:0:0"].value, results[joiner].value
    assert late["ended"] == [(1, 15)] and first["ended"] == [(0, 8), (1, 15)]
    assert late["epochs_run"] == 2, "epochs_run=1 came from the peers, the joiner's own epoch made it 2"
    assert all(torch.equal(a, b) for a, b in zip(late["ema"], first["ema"], strict=True)), "EMA travelled"
    assert close_to(late["params"], REFERENCE_15)


def test_state_one_rank_alone_changes_reaches_a_joiner_from_the_lowest_rank() -> None:
    """An evaluation on rank 0 only: the joiner gets rank 0's plain values (docs/api.md says so)."""
    release = threading.Event()

    def train(env: WorkerEnv, ports: Ports) -> dict[str, Any]:
        net, job = build(env, ports, extra_state={"evaluated_at": -1})
        for x, y in job.micro_batches(15):
            if job.step == 11:
                release.wait(30)
            if job.rank == 0:
                job.extra_state["evaluated_at"] = job.step
            job.backward(nn.functional.mse_loss(net(x), y))
        return {"seen": job.extra_state["evaluated_at"], "rank": job.rank}

    joiner, results = join_after_step_10(ThreadJob(train, nodes=2), release)
    assert all(r.error is None for r in results.values()), [r.error for r in results.values()]
    late = results[joiner].value
    assert late["rank"] != 0 and 10 <= late["seen"] <= 13, late  # rank 0's value at the join boundary
    assert results["t1:0:0"].value == {"seen": 14, "rank": 0}
    assert results["t2:0:0"].value["seen"] == -1, "a rank already in the job keeps its own copy"


def test_a_snapshot_saved_by_the_script_resumes_the_run_where_it_stopped(tmp_path: Path) -> None:
    snap = tmp_path / "snapshot.pt"
    stats = {"epochs_run": 0}
    net, job = build(*alone(), extra_state=stats, resume_from=snap)  # absent: a fresh start
    job.on_epoch(lambda epoch: (stats.__setitem__("epochs_run", epoch + 1), job.save(snap)))
    for x, y in job.micro_batches(11):  # stopped in epoch 1, after the epoch-0 snapshot (step 8)
        job.backward(nn.functional.mse_loss(net(x), y))

    stats2 = {"epochs_run": 0}
    net2, job2 = build(*alone(), extra_state=stats2, resume_from=snap)
    assert (job2.step, job2.epoch, stats2["epochs_run"]) == (8, 1, 1)
    for _ in job2.epochs(2):
        for x, y in job2.micro_batches():
            job2.backward(nn.functional.mse_loss(net2(x), y))
    assert job2.step == 15 and close_to(params(net2), REFERENCE_15)


def test_a_snapshot_that_does_not_fit_names_its_file(tmp_path: Path) -> None:
    bad = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, bad)
    _, job = build(*alone(), resume_from=bad)
    with pytest.raises(CheckpointError, match=rf"{bad} is not a slurm-elastic checkpoint"):
        job.step  # noqa: B018 - the first use joins, and loads the snapshot


def test_a_dataloader_s_dataset_and_settings_give_the_same_training() -> None:
    collate_calls: list[int] = []

    def collate(batch: list[Any]) -> Any:
        collate_calls.append(len(batch))
        return torch.utils.data.default_collate(batch)

    loader = DataLoader(DATA, batch_size=MICRO_BATCH, shuffle=True, collate_fn=collate)
    got = flat(15, loader=loader)
    assert all(torch.equal(a, b) for a, b in zip(got, REFERENCE_15, strict=True)), "batch_size = micro_batch"
    assert collate_calls and set(collate_calls) == {MICRO_BATCH}, "the loader's collate_fn is used"
    pooled = DataLoader(DATA, batch_size=MICRO_BATCH, shuffle=True, num_workers=2)
    got = flat(15, loader=pooled)
    assert all(torch.equal(a, b) for a, b in zip(got, REFERENCE_15, strict=True)), "loader processes: same bits"


def test_a_dataloader_the_job_cannot_honour_is_refused() -> None:
    class Stream(IterableDataset[int]):
        def __iter__(self) -> Any:
            return iter(range(3))

    weighted = DataLoader(DATA, batch_size=2, sampler=WeightedRandomSampler([1.0] * N, N))
    with pytest.raises(ConfigError, match="sampler WeightedRandomSampler is not supported"):
        build(*alone(), loader=weighted)
    with pytest.raises(ConfigError, match="is not map-style"):
        build(*alone(), loader=DataLoader(Stream(), batch_size=2))
    with pytest.raises(ConfigError, match="give dataset= or loader=, not both"):
        ElasticJob(model(), torch.optim.SGD(model().parameters()), dataset=DATA, loader=weighted, global_batch=4)


# --- misuse: the documented error, where it happens -------------------------------------------------


def test_calling_the_loop_again_after_it_finished_is_an_error_naming_the_run_length() -> None:
    net, job = build(*alone())
    for x, y in job.micro_batches(2):
        job.backward(nn.functional.mse_loss(net(x), y))
    with pytest.raises(UsageError, match=r"finished the job at step 2: .*counts the steps of the whole run"):
        job.micro_batches(2)
    with pytest.raises(UsageError, match="called outside a micro-batch"):
        job.backward(nn.functional.mse_loss(net(DATA[0][0]), DATA[0][1]))


def test_a_second_loop_inside_the_first_and_misused_epochs_are_errors() -> None:
    net, job = build(*alone())
    with pytest.raises(UsageError, match=r"job.micro_batches\(\) without total_steps works only inside an epoch"):
        job.micro_batches()
    with pytest.raises(UsageError, match="called outside a micro-batch"):
        job.backward(torch.zeros((), requires_grad=True))
    for x, y in job.micro_batches(1):
        with pytest.raises(UsageError, match=r"job.steps\(\) called while job.micro_batches\(\) is still running"):
            job.steps(3)
        job.backward(nn.functional.mse_loss(net(x), y))

    net, job = build(*alone())
    epochs = job.epochs(2)
    assert next(epochs) == 0
    with pytest.raises(UsageError, match=r"epoch 0 of job.epochs\(\) ended without iterating"):
        next(epochs)  # the body skipped job.micro_batches()

    net, job = build(*alone())
    for _ in job.epochs(1):
        for x, y in job.micro_batches():
            job.backward(nn.functional.mse_loss(net(x), y))
        with pytest.raises(UsageError, match="called twice in epoch 0"):
            job.micro_batches()


def test_ranks_that_break_out_of_a_step_fail_the_job_with_the_documented_error() -> None:
    def train(env: WorkerEnv, ports: Ports) -> None:
        net, job = build(env, ports)  # 2 micro-batches per rank and step
        for i, (x, y) in enumerate(job.micro_batches(8)):
            job.backward(nn.functional.mse_loss(net(x), y))
            if i == 4:  # the first micro-batch of step 3: its reduction waits for the second
                break
        time.sleep(1.0)  # the script goes on after its break (a thread rank's end would close its connection)
        job.rank  # noqa: B018 - any later use raises the error again

    job = ThreadJob(train, nodes=3).start()
    try:
        results = job.join()
        deadline = time.monotonic() + 30  # each rank reports a moment later (an exception may be on its way)
        while job.coordinator.view().phase != "failed" and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        job.stop()
    errors = [r.error for r in results.values()]
    assert all(isinstance(e, UsageError) and "left during step 3" in str(e) for e in errors), errors
    failures = of_kind(job.coordinator.coordinator.events.recent(100), UserFailure)
    assert {f.signature for f in failures} == {"UsageError: the training loop job.micro_batches() was left early"}
    assert job.coordinator.view().phase == "failed", "identical failures on every rank stop the job"


def test_an_elastic_loader_keeps_the_ddp_loop_body_as_it_was() -> None:
    loader = ElasticLoader(DATA, batch_size=MICRO_BATCH)
    with pytest.raises(UsageError, match=r"once given to ElasticJob\(loader=...\)"):
        iter(loader)
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    env, ports = alone()
    job = ElasticJob(net, opt, loader=loader, global_batch=GLOBAL_BATCH, env=env, ports=ports)
    assert len(loader) == 8 * (GLOBAL_BATCH // MICRO_BATCH), "this rank's micro-batches in an epoch"
    for epoch in job.epochs(2):
        loader.sampler.set_epoch(epoch)  # a DistributedSampler habit: only checked
        for x, y in loader:  # the DDP loop body, unchanged
            opt.zero_grad()  # inside the loop: no-ops, the job steps once per global batch
            job.backward(nn.functional.mse_loss(net(x), y))
            opt.step()
    assert all(torch.equal(a, b) for a, b in zip(params(net), REFERENCE_15, strict=True))
    with pytest.raises(UsageError, match=r"set_epoch\(0\) but the job is in epoch 2"):
        loader.sampler.set_epoch(0)
    with pytest.raises(ConfigError, match="drop_last=True"):
        ElasticLoader(DATA, batch_size=2, drop_last=True)
