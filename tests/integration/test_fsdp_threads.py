"""FSDP2 (`fully_shard`) under ElasticJob with ranks as threads (testing.threadranks): a real coordinator, real
gloo groups, FSDP2's own all-gathers and reduce-scatters over them. Faults in forward, reduce-scatter and
the commit, two ranks at once, joins and drains, a corrupted holder, a tampered transfer, and a lost shard:
every surviving rank ends with its shard of the same model, within float32's tolerance of the same training
in one process, and the ledger shows every sample used exactly once."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from slurm_elastic.decide.reshard import shard_rows
from slurm_elastic.decide.shardlayout import plan_layout
from slurm_elastic.errors import ConfigError, UsageError
from slurm_elastic.eventtypes import E, GenerationReady, JobFailed, StateLost, of_kind
from slurm_elastic.faults import FaultPlan
from slurm_elastic.ledger import analyze
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance
from slurm_elastic.testing.threadranks import GroupFault, RankResult, ThreadJob
from slurm_elastic.worker import ElasticJob
from slurm_elastic.worker.checkpoints.checkpoint import CheckpointError
from slurm_elastic.worker.env import WorkerEnv, worker_env
from slurm_elastic.worker.membership.helpers import HELPERS
from slurm_elastic.worker.ports import Ports
from slurm_elastic.worker.sharded.mesh import placeholder_mesh

pytestmark = pytest.mark.timeout(120)

STEPS = 8
GLOBAL_BATCH, MICRO_BATCH = 12, 2  # 6 micro-batches: uneven over 4 and 5 ranks (padding passes)


def dataset() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(6, generator=g), torch.randn(2, generator=g)) for _ in range(120)]


DATA = dataset()


def model(shard: bool = True, shard_group: int | None = None) -> nn.Module:
    """16, 7 and 2 rows: uneven shards, and empty ones at 3 ranks and more."""
    g = torch.Generator().manual_seed(3)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 7), nn.Tanh(), nn.Linear(7, 2))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    if shard:
        mesh = placeholder_mesh(shard_group=shard_group)
        for layer in (net[0], net[2], net[4]):
            fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
    return net


def trainer(
    steps: int = STEPS,
    gate: Callable[[ElasticJob, int], None] | None = None,
    poke: Callable[[ElasticJob], None] | None = None,
    shard_group: int | None = None,
    save_to: Path | None = None,
    resume_from: Path | None = None,
) -> Callable[[WorkerEnv, Ports], Any]:
    def train(env: WorkerEnv, ports: Ports) -> dict[str, Any]:
        net = model(shard_group=shard_group)
        opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.1)
        extra = {"count": 0, "last": torch.zeros(2)}  # the user's own state: in every transfer, like the shards
        job = ElasticJob(
            net, opt, dataset=DATA, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH, env=env, ports=ports,
            extra_state=extra, resume_from=resume_from,
        )  # fmt: skip

        @job.on_step
        def count(step: int, loss: float) -> None:
            extra["count"] += 1
            extra["last"] += torch.tensor([1.0, loss])

        if poke is not None:
            poke(job)
        for step in job.steps(steps):
            if gate is not None:
                gate(job, step.number)
            for x, y in step.micro_batches():
                step.backward(nn.functional.mse_loss(net(x), y))
        if save_to is not None:
            job.save(save_to)  # on every rank: each writes its shard
        full = [p.full_tensor().detach().clone() for p in net.parameters()]  # type: ignore[attr-defined]
        return {"params": full, "world": job.world_size, "step": job.step, "extra": (extra["count"], extra["last"])}

    return train


def reference(steps: int = STEPS) -> list[torch.Tensor]:
    """The same training, unsharded, in this one process (float32 sums in another order)."""
    net = model(shard=False)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.1)
    env = worker_env({"SLURM_ELASTIC_REDUCE_DTYPE": "float32"})
    job = ElasticJob(
        net, opt, dataset=DATA, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH, env=env,
        ports=Ports(process_hooks=False),
    )  # fmt: skip
    for step in job.steps(steps):
        for x, y in step.micro_batches():
            step.backward(nn.functional.mse_loss(net(x), y))
    return [p.detach().clone() for p in net.parameters()]


REFERENCE = reference()


def assert_reference(results: dict[str, RankResult], world: int) -> None:
    for r in results.values():
        assert r.error is None, f"{r.worker}: {r.error!r}"
    done = [r for r in results.values() if r.value is not None]
    assert len(done) == world and all(r.value["world"] == world for r in done)
    first = done[0].value["params"]
    for r in done:  # every rank gathers the same full model from the shards
        assert all(torch.equal(a, b) for a, b in zip(r.value["params"], first, strict=True))
        # a joiner or a healed rank holds the user's state of the others (a tensor restored in place, a count)
        assert r.value["extra"][0] == STEPS and torch.equal(r.value["extra"][1], done[0].value["extra"][1])
        assert r.value["extra"][1][0] == STEPS
    got = {str(i): t for i, t in enumerate(first)}
    diff = max_param_rel_diff(got, {str(i): t for i, t in enumerate(REFERENCE)})
    assert diff <= tolerance("float32", STEPS), diff


def assert_exactly_once(ledger: Path, steps: int = STEPS) -> None:
    report = analyze(ledger)
    assert (report.committed_steps, report.duplicate_samples, report.skipped_samples) == (steps, 0, 0)


def events(job: ThreadJob, kind: str) -> list[dict[str, Any]]:
    """The plain records of one kind (a worker's own reports, such as `shard_refused`)."""
    return [e for e in job.coordinator.coordinator.events.recent(200) if e["event"] == kind]


def of(job: ThreadJob, kind: type[E]) -> list[E]:
    return of_kind(job.coordinator.coordinator.events.recent(200), kind)


def ready_events(job: ThreadJob) -> list[GenerationReady]:
    return of(job, GenerationReady)


def test_no_fault_matches_the_one_process_training(tmp_path: Path) -> None:
    job = ThreadJob(trainer(), nodes=3, reduce_dtype="float32", ledger_dir=tmp_path)
    assert_reference(job.run(), world=3)
    assert_exactly_once(tmp_path)
    ready = ready_events(job)[0]
    assert ready.strategy == "fsdp2" and ready.mirrors is True and "fresh start" in ready.transfer
    # The script seeds its model: every rank holds the same initial state and takes its rows locally.
    assert ready.bytes == 0 and "3 members hold the same" in ready.transfer, ready


def test_a_rank_whose_initial_model_differs_takes_rank_0s(tmp_path: Path) -> None:
    def differ(job: ElasticJob) -> None:
        if job.env.node == "t2":
            with torch.no_grad():
                next(job.model.parameters())._local_tensor.add_(1.0)  # type: ignore[attr-defined]

    job = ThreadJob(trainer(poke=differ), nodes=3, reduce_dtype="float32", ledger_dir=tmp_path)
    assert_reference(job.run(), world=3)
    ready = ready_events(job)[0]
    assert ready.receivers == (1,) and "2 members hold the same" in ready.transfer
    # The event counts every rank's sends: rank 1's own shard and its ward's, taken from ranks 0 and 2.
    ward = plan_layout(["t1", "t2", "t3"], None).wards[1]  # type: ignore[index]
    rows = [(p, *shard_rows(len(p), 3, i)) for p in model(shard=False).parameters() for i in (1, ward)]
    assert ready.bytes == sum((hi - lo) * p[0].numel() * p.element_size() for p, lo, hi in rows), ready


def test_the_placeholder_mesh_model_is_released_once_on_the_generation_mesh() -> None:
    # The script's model, sharded on the one-rank placeholder mesh, holds every parameter in full; once the
    # job has moved it onto the generation's mesh, nothing may keep those full tensors alive.
    placeholder: dict[str, list[weakref.ref[torch.Tensor]]] = {}
    alive: dict[str, int] = {}

    def remember(job: ElasticJob) -> None:
        params = list(job.model.parameters())
        placeholder[job.env.node] = [weakref.ref(t) for p in params for t in (p, p._local_tensor)]  # type: ignore[attr-defined]

    def check(job: ElasticJob, step: int) -> None:
        if step == 2:
            gc.collect()
            alive[job.env.node] = sum(ref() is not None for ref in placeholder[job.env.node])

    job = ThreadJob(trainer(gate=check, poke=remember), nodes=2, reduce_dtype="float32")
    assert_reference(job.run(), world=2)
    assert alive == {"t1": 0, "t2": 0}


def test_the_blocking_collectives_of_every_step_share_a_few_helper_threads() -> None:
    # gloo's reduce-scatter and send/recv have no future, so each wait runs on a helper thread. One thread
    # started per call made the worker's memory creep up, step after step (docs/architecture.md, "What it costs").
    started, served = HELPERS.started, HELPERS.served
    job = ThreadJob(trainer(), nodes=3, reduce_dtype="float32")
    assert_reference(job.run(), world=3)
    calls, threads = HELPERS.served - served, HELPERS.started - started
    assert calls >= 3 * STEPS * 3, calls  # at least three such calls per rank and step
    assert threads <= 2 * 3, (threads, calls)  # a few per rank at most, however many steps


@pytest.mark.parametrize(
    ("kind", "nth", "nodes"),
    [("all_gather", 5, 3), ("reduce_scatter", 7, 4), ("allreduce", 3, 5)],  # forward, backward's sum, the commit's sum
)
def test_a_rank_dying_in_a_collective_is_healed_from_its_mirror(
    tmp_path: Path, kind: str, nth: int, nodes: int
) -> None:
    fault = GroupFault("t2:0:0", 1, nth, "die", kind=kind)  # type: ignore[arg-type]
    job = ThreadJob(trainer(), nodes=nodes, faults=[fault], reduce_dtype="float32", ledger_dir=tmp_path)
    results = job.run()
    assert results["t2:0:0"].died
    assert_reference(results, world=nodes - 1)
    assert_exactly_once(tmp_path)
    healed = ready_events(job)[-1]
    assert healed.generation == 2 and healed.world == nodes - 1 and healed.bytes > 0


def test_a_rank_that_missed_the_commit_finishes_the_step_from_its_gradients(tmp_path: Path) -> None:
    # Step 2's last sum completes everywhere, but t2 sees it fail: the others commit step 2, t2 holds its
    # gradients (and its ward's) and rolls forward when the group re-forms. No step is lost or re-run.
    fault = GroupFault("t2:0:0", 1, 3, "raise_after", kind="allreduce")
    job = ThreadJob(trainer(), nodes=3, faults=[fault], reduce_dtype="float32", ledger_dir=tmp_path)
    assert_reference(job.run(), world=3)
    assert_exactly_once(tmp_path)
    healed = ready_events(job)[-1]
    assert healed.resume_step == 2 and "finish step 2 first" in healed.transfer, healed


def test_two_ranks_lost_at_once_that_share_no_shard(tmp_path: Path) -> None:
    # Five ranks, each mirroring the previous one's shard: t2 and t4 hold no shard in common.
    faults = [GroupFault(w, 1, 9, "die") for w in ("t2:0:0", "t4:0:0")]
    job = ThreadJob(trainer(), nodes=5, faults=faults, reduce_dtype="float32", ledger_dir=tmp_path)
    results = job.run()
    assert results["t2:0:0"].died and results["t4:0:0"].died
    assert_reference(results, world=3)
    assert_exactly_once(tmp_path)


def test_both_holders_of_a_shard_lost_is_said_in_one_event_and_never_resumed_silently() -> None:
    # t2 holds shard 1 and mirrors shard 0; t3 mirrors shard 1: both gone, shard 1 has no holder. Without
    # checkpoints the job fails, naming the setting that would have let it resume.
    faults = [GroupFault(w, 1, 9, "die") for w in ("t2:0:0", "t3:0:0")]
    job = ThreadJob(trainer(), nodes=4, faults=faults, reduce_dtype="float32")
    results = job.run()
    ended = [r for r in results.values() if not r.died]
    assert ended and all(r.ending == "job_failed" for r in ended), [(r.worker, r.ending, r.error) for r in ended]
    lost = of(job, StateLost)
    assert lost and "no live holder" in lost[0].detail
    failed = of(job, JobFailed)
    assert failed and "--checkpoint-dir" in failed[-1].reason


def grow_by_one(nodes: int, tmp_path: Path, shard_group: int | None = None) -> tuple[ThreadJob, dict[str, RankResult]]:
    """A job of `nodes` ranks that one more rank joins before step 4."""
    release = threading.Event()

    def gate(job: ElasticJob, step: int) -> None:
        if step == 4:
            release.wait(30)

    train = trainer(gate=gate, shard_group=shard_group)
    job = ThreadJob(train, nodes=nodes, reduce_dtype="float32", ledger_dir=tmp_path).start()
    try:
        job.wait_step(3)
        job.add_rank()
        _wait(lambda: job.coordinator.status().pending != [])
        release.set()
        return job, job.join()
    finally:
        job.stop()


def test_a_joiner_takes_its_shards_from_peers(tmp_path: Path) -> None:
    job, results = grow_by_one(2, tmp_path)
    assert_reference(results, world=3)
    assert_exactly_once(tmp_path)
    grown = ready_events(job)[-1]
    assert grown.world == 3 and 2 in grown.receivers


def test_a_drained_rank_leaves_and_the_rest_re_shard(tmp_path: Path) -> None:
    release = threading.Event()
    job = ThreadJob(
        trainer(gate=lambda job, step: release.wait(30) if step == 4 else None),
        nodes=4,
        reduce_dtype="float32",
        ledger_dir=tmp_path,
    ).start()
    try:
        job.wait_step(3)
        job.coordinator.drain(["t3"], "boundary", "reclaim")
        release.set()
        results = job.join()
    finally:
        job.stop()
    assert results["t3:0:0"].ending == "left"
    assert_reference({k: v for k, v in results.items() if k != "t3:0:0"}, world=3)
    assert_exactly_once(tmp_path)


def test_a_corrupted_holder_is_refused_and_its_rows_come_from_the_other(tmp_path: Path) -> None:
    # t4 drains after step 5; when generation 2 forms, bits of t2's own shard flip (after its digest was
    # taken at step 5's commit): the digest no longer matches, so its rows come from the rank mirroring them.
    release = threading.Event()
    plan = FaultPlan().corrupt("t2", step=6)  # fires when a generation forms before step 6
    job = ThreadJob(
        trainer(gate=lambda job, step: release.wait(30) if step == 5 else None),
        nodes=4,
        plan=plan,
        reduce_dtype="float32",
        ledger_dir=tmp_path,
    ).start()
    try:
        job.wait_step(4)
        job.coordinator.drain(["t4"], "boundary", "reclaim")
        release.set()
        results = job.join()
    finally:
        job.stop()
    assert_reference({k: v for k, v in results.items() if k != "t4:0:0"}, world=3)
    assert_exactly_once(tmp_path)
    refused = events(job, "shard_refused")
    assert refused and "fails its digest check" in refused[0]["detail"], refused


def test_a_range_corrupted_in_transit_is_refused_and_sent_again_by_another_holder(tmp_path: Path) -> None:
    # When t4 dies, t2 serves rows to peers; what it sends is altered after its checksums were taken.
    def tamper(job: ElasticJob) -> None:
        def flip(dst: int, payload: torch.Tensor) -> None:
            if payload.numel() and job.generation > 1:
                payload[0] ^= 0xFF

        if job.env.node == "t2":
            job._phases.on_send(flip)  # the runtime calls it before each shard it sends (worker.phases)

    faults = [GroupFault("t4:0:0", 1, 9, "die")]
    job = ThreadJob(trainer(poke=tamper), nodes=4, faults=faults, reduce_dtype="float32", ledger_dir=tmp_path)
    results = job.run()
    assert_reference(results, world=3)
    assert_exactly_once(tmp_path)
    refused = events(job, "shard_refused")
    assert any("failed its checksum or step" in e["detail"] for e in refused), refused


def _wait(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_what_a_sharded_model_cannot_take_is_refused_by_name(tmp_path: Path) -> None:
    def job(**kw: Any) -> ElasticJob:
        net = model()
        opt = torch.optim.AdamW(net.parameters(), lr=0.01)
        return ElasticJob(
            net, opt, dataset=DATA, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH, env=worker_env({}),
            ports=Ports(process_hooks=False), **kw,
        )  # fmt: skip

    with pytest.raises(ConfigError, match="invalid reduce_dtype 'float64' for a fully_shard model"):
        job(reduce_dtype="float64")
    (tmp_path / "partial" / "step-000000004" / "rank-00000").mkdir(parents=True)  # a save on one rank only
    with pytest.raises(CheckpointError, match=r"partial holds no complete sharded snapshot: .* on every rank"):
        job(resume_from=tmp_path / "partial").step  # noqa: B018  # the first use joins the job and loads


@pytest.mark.parametrize("write", ["parameter", "moment", "dcp"])
def test_state_written_between_steps_is_refused_by_name(tmp_path: Path, write: str) -> None:
    # A script that loads its own checkpoint inside the loop changes the shards under the job: their mirrors
    # would not follow, and a recovery would bring back what the load replaced. It is an error, at once.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    job = ElasticJob(
        net, opt, dataset=DATA, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH, env=worker_env({}),
        ports=Ports(process_hooks=False),
    )  # fmt: skip
    ran = []
    with pytest.raises(UsageError, match=r"written between steps .* load before ElasticJob\(\.\.\.\)"):
        for step in job.steps(STEPS):
            ran.append(step.number)
            for x, y in step.micro_batches():
                step.backward(nn.functional.mse_loss(net(x), y))
            if step.number < 2:
                continue
            with torch.no_grad():
                if write == "parameter":
                    next(net.parameters()).mul_(2)
                elif write == "moment":
                    next(iter(opt.state.values()))["exp_avg"].mul_(2)
                else:  # the script's own checkpointer, saving and loading back in the loop
                    state = {"model": get_model_state_dict(net), "optim": get_optimizer_state_dict(net, opt)}
                    dcp.save(state, checkpoint_id=tmp_path / "own")
                    dcp.load(state, checkpoint_id=tmp_path / "own")
                    set_model_state_dict(net, state["model"])
                    set_optimizer_state_dict(net, opt, state["optim"])
    assert ran == [1, 2]  # written after step 1 had committed, before step 2 commits: never committed


def test_a_snapshot_saved_by_every_rank_resumes_at_another_world_size(tmp_path: Path) -> None:
    # Three ranks train 4 steps and each saves its shard; two ranks resume from the snapshot (re-sharded
    # from disk, 3 -> 2) and train the other 4: the same model as 8 steps without a stop.
    snapshot = tmp_path / "snapshot"
    first = ThreadJob(trainer(steps=4, save_to=snapshot), nodes=3, reduce_dtype="float32")
    assert all(r.error is None and r.value["step"] == 4 for r in first.run().values())
    assert sorted(p.name for p in (snapshot / "step-000000004").iterdir()) == [f"rank-0000{r}" for r in range(3)]
    second = ThreadJob(trainer(resume_from=snapshot), nodes=2, reduce_dtype="float32", ledger_dir=tmp_path / "l")
    results = second.run()
    assert_reference(results, world=2)  # the user's own state (a count of 8 steps) came back too
    ready = ready_events(second)[0]
    assert ready.resume_step == 4 and "sharded checkpoint of step 4 (saved by 3 ranks)" in ready.transfer, ready
    # The same snapshot, resumed by the script run on its own (no launcher: one process, the whole model).
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.1)
    extra = {"count": 0, "last": torch.zeros(2)}
    alone = ElasticJob(
        net, opt, dataset=DATA, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH, env=worker_env({}),
        ports=Ports(process_hooks=False), extra_state=extra, resume_from=snapshot,
    )  # fmt: skip
    ran = []
    for step in alone.steps(STEPS):
        ran.append(step.number)
        for x, y in step.micro_batches():
            step.backward(nn.functional.mse_loss(net(x), y))
    assert ran == [5, 6, 7, 8] and extra["count"] == 4
    got = {str(i): p.full_tensor() for i, p in enumerate(net.parameters())}  # type: ignore[attr-defined]
    assert max_param_rel_diff(got, {str(i): t for i, t in enumerate(REFERENCE)}) <= tolerance("float32", STEPS)
