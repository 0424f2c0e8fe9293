"""A script's own checkpoints beside the job's (docs/api.md): a `torch.save` of its model, optimizer and
iteration written inside the job's loop, loaded by the script before it builds the job next time, with
`start_step=` telling the job where the data resumes. At another world size the resumed run ends with the
uninterrupted run's model; where the job has a snapshot of its own (`resume_from=`), the job's wins. Ranks
are threads around a real coordinator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from slurm_elastic.errors import ConfigError
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance
from slurm_elastic.testing.threadranks import ThreadJob
from slurm_elastic.worker import ElasticJob
from slurm_elastic.worker.env import WorkerEnv, worker_env
from slurm_elastic.worker.ports import Ports

pytestmark = pytest.mark.timeout(120)

STEPS, GLOBAL_BATCH, MICRO_BATCH = 8, 12, 2


def dataset() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(6, generator=g), torch.randn(2, generator=g)) for _ in range(60)]


DATA = dataset()  # 5 steps an epoch: the resumed run crosses an epoch's end too


def model() -> nn.Module:
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    g = torch.Generator().manual_seed(3)  # not torch's global generator, which the rank threads share
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return net


def trainer(own: Path, *, save: bool = False, load: bool = False, **job_args: Any) -> Any:
    """The script: its own checkpoint (`own`) written at step 4 (`save`) or loaded before the job (`load`)."""

    def train(env: WorkerEnv, ports: Ports) -> dict[str, Any]:
        net = model()
        opt = torch.optim.AdamW(net.parameters(), lr=0.01)
        start = None
        if load:  # the script's own resume, as it was before the job
            ckpt = torch.load(own, weights_only=True)
            net.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            start = ckpt["iter_num"]
        job = ElasticJob(
            net, opt, dataset=DATA, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH, start_step=start,
            env=env, ports=ports, **job_args,
        )  # fmt: skip
        first, seen = job.step, set()
        for x, y in job.micro_batches(STEPS):
            if save and job.rank == 0 and job.step not in seen:  # a step's first micro-batch: between steps
                seen.add(job.step)
                if job.step == 4:
                    state = {"model": net.state_dict(), "optimizer": opt.state_dict(), "iter_num": job.step}
                    torch.save(state, own)
                if job.step == 6:
                    job.save(own.with_suffix(".job"))  # the job's own snapshot, two steps later
            job.backward(nn.functional.mse_loss(net(x), y))
        return {"params": {k: v.detach().clone() for k, v in net.state_dict().items()}, "first": first}

    return train


def run(train: Any, nodes: int) -> list[dict[str, Any]]:
    results = ThreadJob(train, nodes=nodes).run()
    assert all(r.error is None for r in results.values()), [r.error for r in results.values()]
    return [r.value for r in results.values()]


def same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return max_param_rel_diff(got, want) <= tolerance("float64", STEPS)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    own = tmp_path_factory.mktemp("own") / "ckpt.pt"
    return own, run(trainer(own, save=True), nodes=2)[0]["params"]


def test_the_scripts_own_checkpoint_resumes_the_run_at_another_world_size(uninterrupted: Any) -> None:
    own, want = uninterrupted
    for value in run(trainer(own, load=True), nodes=3):
        assert value["first"] == 4, "the job starts at the script's step"
        assert same(value["params"], want), max_param_rel_diff(value["params"], want)


def test_without_start_step_the_data_would_start_over(uninterrupted: Any) -> None:
    own, want = uninterrupted
    ckpt = torch.load(own, weights_only=True)
    net = model()
    net.load_state_dict(ckpt["model"])
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    opt.load_state_dict(ckpt["optimizer"])
    env, ports = worker_env({"SLURM_ELASTIC_REDUCE_DTYPE": "float64"}), Ports(process_hooks=False)
    job = ElasticJob(net, opt, dataset=DATA, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH, env=env, ports=ports)
    for x, y in job.micro_batches(4):  # 4 more steps, from sample 0 again
        job.backward(nn.functional.mse_loss(net(x), y))
    assert not same({k: v.detach() for k, v in net.state_dict().items()}, want)


def test_the_jobs_own_snapshot_wins_over_the_scripts(uninterrupted: Any) -> None:
    own, want = uninterrupted
    for value in run(trainer(own, load=True, resume_from=own.with_suffix(".job")), nodes=2):
        assert value["first"] == 6, "the job's snapshot (step 6) replaced what the script loaded (step 4)"
        assert same(value["params"], want)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"start_step": -1, "global_batch": 12}, r"invalid start_step -1: expected the integer step"),
        ({"start_step": 4, "per_replica_batch": 6}, r"start_step= needs global_batch="),
    ],
)
def test_a_bad_start_step_is_refused_in_one_line(args: dict[str, Any], error: str) -> None:
    net = model()
    with pytest.raises(ConfigError, match=error):
        ElasticJob(net, torch.optim.SGD(net.parameters(), lr=0.1), dataset=DATA, micro_batch=2, **args)


@pytest.mark.parametrize("norm", [-1.0, float("inf"), float("nan"), "1.0", True])
def test_a_bad_clip_norm_is_refused_in_one_line(norm: Any) -> None:
    net = model()
    with pytest.raises(ConfigError, match=r"^invalid clip_grad_norm .*: expected a norm > 0, or 0 or None"):
        ElasticJob(net, torch.optim.SGD(net.parameters(), lr=0.1), dataset=DATA, micro_batch=2, clip_grad_norm=norm)


def test_a_clip_norm_of_0_clips_nothing() -> None:
    net = model()
    job = ElasticJob(net, torch.optim.SGD(net.parameters(), lr=0.1), dataset=DATA, micro_batch=2, clip_grad_norm=0)
    assert job._settings.clip_grad_norm is None
