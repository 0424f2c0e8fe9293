"""A script that samples its own batches (`batch_fn=`, worker.input.sampled): random windows of a token
stream, drawn with the generator the job seeds by each micro-batch's place in the run. Through a rank's
death mid-step and a join, the model equals one process's training on the same draws, and the ledger shows
every micro-batch of the stream once. Ranks are threads around a real coordinator."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from slurm_elastic.errors import ConfigError, UsageError
from slurm_elastic.ledger import analyze
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance
from slurm_elastic.testing.threadranks import GroupFault, ThreadJob
from slurm_elastic.worker import ElasticJob
from slurm_elastic.worker.env import WorkerEnv, worker_env
from slurm_elastic.worker.ports import Ports

pytestmark = pytest.mark.timeout(120)

STEPS = 8
GLOBAL_BATCH, MICRO_BATCH, BLOCK, VOCAB = 12, 2, 8, 40
TOKENS = torch.randint(0, VOCAB, (600,), generator=torch.Generator().manual_seed(5))


def get_batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The script's own sampling: MICRO_BATCH random windows of the token stream."""
    ix = torch.randint(len(TOKENS) - BLOCK - 1, (MICRO_BATCH,), generator=generator)
    x = torch.stack([TOKENS[i : i + BLOCK] for i in ix])
    y = torch.stack([TOKENS[i + 1 : i + 1 + BLOCK] for i in ix])
    return x, y


def model() -> nn.Module:
    net = nn.Sequential(nn.Embedding(VOCAB, 12), nn.Tanh(), nn.Linear(12, VOCAB))
    g = torch.Generator().manual_seed(3)  # not torch's global generator, which the rank threads share
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return net


def lm_loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(net(x).flatten(0, 1), y.flatten())


def build(env: WorkerEnv, ports: Ports, **kwargs: Any) -> tuple[nn.Module, ElasticJob]:
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    args: dict[str, Any] = {"batch_fn": get_batch, "micro_batch": MICRO_BATCH, "global_batch": GLOBAL_BATCH}
    return net, ElasticJob(net, opt, env=env, ports=ports, **{**args, **kwargs})


def alone() -> tuple[WorkerEnv, Ports]:
    return worker_env({"SLURM_ELASTIC_REDUCE_DTYPE": "float64"}), Ports(process_hooks=False)


def params(net: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def reference(steps: int = STEPS) -> dict[str, torch.Tensor]:
    net, job = build(*alone())
    for x, y in job.micro_batches(steps):
        job.backward(lm_loss(net, x, y))
    return params(net)


def trainer(gate: threading.Event | None = None) -> Any:
    def train(env: WorkerEnv, ports: Ports) -> dict[str, Any]:
        net, job = build(env, ports)
        for x, y in job.micro_batches(STEPS):
            if gate is not None and job.step == 4:
                gate.wait(30)
            job.backward(lm_loss(net, x, y))
        return {"params": params(net), "world": job.world_size}

    return train


def same_model(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return max_param_rel_diff(got, want) <= tolerance("float64", STEPS)


def drawn(steps: int, **kwargs: Any) -> list[torch.Tensor]:
    """The windows one process draws in `steps` steps, micro-batch after micro-batch."""
    net, job = build(*alone(), **kwargs)
    xs = []
    for x, y in job.micro_batches(steps):
        xs.append(x)
        job.backward(lm_loss(net, x, y))
    return xs


def test_the_generator_is_seeded_by_the_place_in_the_run() -> None:
    first = drawn(2)
    assert len(first) == 2 * GLOBAL_BATCH // MICRO_BATCH
    assert all(not torch.equal(a, b) for a, b in itertools.pairwise(first)), "each micro-batch draws afresh"
    assert all(torch.equal(a, b) for a, b in zip(first, drawn(2), strict=True)), "a re-run draws the same"
    assert not torch.equal(drawn(1, seed=1)[0], first[0]), "the run's seed is part of it"


def test_a_rank_dying_mid_step_re_runs_the_same_draws_at_the_smaller_world(tmp_path: Path) -> None:
    # 6 micro-batches a step: 2 a rank at world 3, 3 at world 2; t3 dies in generation 1's 6th collective.
    job = ThreadJob(trainer(), nodes=3, faults=[GroupFault("t3:0:0", 1, 6, "die")], ledger_dir=tmp_path)
    results = job.run()
    assert results["t3:0:0"].died
    done = [r.value for r in results.values() if r.value is not None]
    assert len(done) == 2 and all(v["world"] == 2 for v in done)
    want = reference()
    assert all(same_model(v["params"], want) for v in done), [max_param_rel_diff(v["params"], want) for v in done]
    ledger = analyze(tmp_path)
    assert (ledger.committed_steps, ledger.duplicate_samples, ledger.skipped_samples) == (STEPS, 0, 0)


def test_a_joiner_draws_its_share_of_the_same_stream(tmp_path: Path) -> None:
    gate = threading.Event()
    job = ThreadJob(trainer(gate), nodes=2, ledger_dir=tmp_path).start()
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
    want = reference()
    assert all(same_model(r.value["params"], want) for r in results.values())
    ledger = analyze(tmp_path)
    assert (ledger.committed_steps, ledger.duplicate_samples, ledger.skipped_samples) == (STEPS, 0, 0)


def test_an_open_ended_loop_ends_where_every_rank_breaks() -> None:
    def train(env: WorkerEnv, ports: Ports) -> dict[str, Any]:
        net, job = build(env, ports)
        for x, y in job.micro_batches():  # no total: the script's own `while True` ... `break`
            if job.step == 5:
                break
            job.backward(lm_loss(net, x, y))
        return {"params": params(net), "step": job.step}

    results = ThreadJob(train, nodes=3).run()
    assert all(r.error is None and r.ending is None for r in results.values()), results
    want = reference(5)
    for r in results.values():
        assert r.value["step"] == 5 and same_model(r.value["params"], want)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"dataset": [1, 2, 3]}, "give it without dataset"),
        ({"global_batch": 10, "micro_batch": 4}, "global_batch 10 is not a multiple of micro_batch 4"),
        ({"global_batch": None, "per_replica_batch": 6, "micro_batch": 4}, "per_replica_batch 6 is not a multiple"),
        ({"batch_fn": "windows"}, "batch_fn must be a function of a torch.Generator, got str"),
    ],
)
def test_bad_sampling_arguments_are_refused_in_one_line(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        build(*alone(), **kwargs)


def test_epochs_need_a_data_set() -> None:
    _net, job = build(*alone())
    with pytest.raises(UsageError, match="with batch_fn= there are no epochs"):
        job.epochs(2)
