"""Where a training loop ends, with ranks as threads around a real coordinator: a `break` that every rank takes
at the same step boundary ends the job there (any loop form), `job.stop()` from one rank ends every rank's
loop at the next boundary, and ranks whose loops disagree fail the job at once with both sides named."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from slurm_elastic.testing.threadranks import ThreadJob
from slurm_elastic.worker import ElasticJob
from slurm_elastic.worker.env import WorkerEnv
from slurm_elastic.worker.ports import Ports

from .test_loop_api import alone, build, close_to, flat, params

pytestmark = pytest.mark.timeout(120)

Train = Callable[[ElasticJob, nn.Module], None]


def loss(net: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(net(x), y)


def flat_break_before(job: ElasticJob, net: nn.Module) -> None:
    for batch in job.micro_batches(12):
        if job.step == 5:  # at the first micro-batch of step 6, before its backward
            break
        job.backward(loss(net, batch))


def flat_break_after(job: ElasticJob, net: nn.Module) -> None:
    job.rank  # noqa: B018 - joins: the step's plan is known
    per_step = len(job._stepper.mine())  # this rank's micro-batches of a step
    for i, batch in enumerate(job.micro_batches(12)):
        job.backward(loss(net, batch))
        if i + 1 == 5 * per_step:  # the last micro-batch of step 5: it commits, then the loop ends
            break


def steps_break(job: ElasticJob, net: nn.Module) -> None:
    for step in job.steps(12):
        if job.step == 5:
            break
        for batch in step.micro_batches():
            step.backward(loss(net, batch))


def steps_return(job: ElasticJob, net: nn.Module) -> None:
    for step in job.steps(12):
        for batch in step.micro_batches():
            step.backward(loss(net, batch))
        if step.number == 5:  # its micro-batches are done: it commits as the loop ends
            return


def epochs_break(job: ElasticJob, net: nn.Module) -> None:
    for _ in job.epochs(3):
        for batch in job.micro_batches():
            job.backward(loss(net, batch))
        break  # after epoch 0, which ends with step 8


def ranks(train: Train, nodes: int = 3, **build_args: Any) -> dict[str, Any]:
    """Run `train` on `nodes` thread ranks; each returns its parameters, step and rank after the loop."""

    def rank(env: WorkerEnv, ports: Ports) -> dict[str, Any]:
        net, job = build(env, ports, **build_args)
        train(job, net)
        return {"params": params(net), "step": job.step, "rank": job.rank, "world": job.world_size}

    job = ThreadJob(rank, nodes=nodes)
    results = job.run()
    view = job.coordinator.view()
    assert all(r.error is None and r.ending is None for r in results.values()), results
    return {"phase": view.phase, "reason": view.reason, "values": [r.value for r in results.values()]}


@pytest.mark.parametrize(
    ("train", "step"),
    [(flat_break_before, 5), (flat_break_after, 5), (steps_break, 5), (steps_return, 5), (epochs_break, 8)],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_a_break_every_rank_takes_at_one_boundary_ends_the_job_there(train: Train, step: int) -> None:
    out = ranks(train)
    assert out["phase"] == "finished" and f"ended at step {step}" in out["reason"], out["reason"]
    reference = flat(step)
    for value in out["values"]:
        assert value["step"] == step and value["world"] == 3  # the job is usable after its loop
        assert close_to(value["params"], reference)
    assert sorted(v["rank"] for v in out["values"]) == [0, 1, 2]


def test_a_break_alone_ends_the_loop_where_it_is() -> None:
    net, job = build(*alone())
    steps_break(job, net)
    assert job.step == 5 and close_to(params(net), flat(5))
    with pytest.raises(Exception, match=r"finished the job at step 5"):
        job.micro_batches(3)


def test_a_rank_that_breaks_alone_fails_the_job_naming_both_sides() -> None:
    def train(job: ElasticJob, net: nn.Module) -> None:
        for batch in job.micro_batches(12):
            if job.rank == 0 and job.step == 3:
                break
            job.backward(loss(net, batch))

    def rank(env: WorkerEnv, ports: Ports) -> None:
        net, job = build(env, ports)
        train(job, net)

    job = ThreadJob(rank, nodes=3)
    began = time.monotonic()
    results = job.run()
    took = time.monotonic() - began
    view = job.coordinator.view()
    assert view.phase == "failed", view.reason
    assert "loop of t1:0:0 at step 3 (job.micro_batches() left at step 3) ended" in view.reason, view.reason
    assert "went on to step 4" in view.reason and "job.stop()" in view.reason
    others = [r for w, r in results.items() if w != "t1:0:0"]
    assert all(r.ending == "job_failed" and r.code == 1 for r in others), others
    assert took < job.pg_timeout_s, "found by the heartbeats, not by a collective's timeout"


def test_loops_of_different_lengths_fail_the_job_at_once() -> None:
    def rank(env: WorkerEnv, ports: Ports) -> None:
        net, job = build(env, ports)
        total = 9 if env.node == "t2" else 8
        for batch in job.micro_batches(total):
            job.backward(loss(net, batch))

    job = ThreadJob(rank, nodes=2)
    results = job.run()
    view = job.coordinator.view()
    assert view.phase == "failed" and view.last_step == 0, view.reason
    assert "loops differ: total_steps " in view.reason and "job.step on a rank that joined" in view.reason
    assert "8 on t1:0:0" in view.reason and "9 on t2:0:0" in view.reason, view.reason
    assert all(r.ending == "job_failed" for r in results.values()), results


def stop_on_rank_0(at: int) -> Train:
    def train(job: ElasticJob, net: nn.Module) -> None:
        for batch in job.micro_batches(40):
            job.backward(loss(net, batch))
            if job.rank == 0 and job.step == at:
                job.stop("time budget")

    return train


def test_stop_from_one_rank_ends_every_rank_at_the_next_boundary() -> None:
    out = ranks(stop_on_rank_0(3))
    assert out["phase"] == "finished" and "time budget" in out["reason"], out["reason"]
    (step,) = {v["step"] for v in out["values"]}
    assert 3 < step < 40
    reference = flat(step)
    assert all(close_to(v["params"], reference) for v in out["values"])


def test_stop_alone_ends_at_the_next_boundary() -> None:
    net, job = build(*alone())
    stop_on_rank_0(3)(job, net)
    assert job.step == 4 and close_to(params(net), flat(4))


def test_stop_may_come_from_every_rank_and_from_a_hook() -> None:
    def train(job: ElasticJob, net: nn.Module) -> None:
        job.on_step(lambda step, _: job.stop("early stop") if step == 2 else None)
        for batch in job.micro_batches(40):
            job.backward(loss(net, batch))

    out = ranks(train)
    assert out["phase"] == "finished" and "early stop" in out["reason"]
    (step,) = {v["step"] for v in out["values"]}
    assert close_to(out["values"][0]["params"], flat(step))
