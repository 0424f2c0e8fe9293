"""Which strategy trains a model (worker.choose), and that the sharded one, with torch's private FSDP2 modules,
loads only for a `fully_shard` model on a torch that has what it needs."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import torch
from torch import nn

from slurm_elastic.errors import ConfigError
from slurm_elastic.worker import ElasticJob, placeholder_mesh
from slurm_elastic.worker.choose import SHARDED_TORCH, is_fully_sharded, sharded_support, torch_release
from slurm_elastic.worker.env import worker_env
from slurm_elastic.worker.ports import Ports
from slurm_elastic.worker.replicated.strategy import ReplicatedStrategy

DATA = [(torch.zeros(3), torch.zeros(1)) for _ in range(8)]


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("2.13.0+cpu", (2, 13)),
        ("2.9.0", (2, 9)),
        ("2.9.0a0+git1234abc", (2, 9)),
        ("2.10.1+cu128", (2, 10)),
        ("10.0", (10, 0)),
        ("unknown", None),
        ("", None),
    ],
)
def test_a_torch_version_reads_as_its_release(version: str, release: tuple[int, int] | None) -> None:
    assert torch_release(version) == release


@pytest.mark.parametrize("version", ["2.3.1", "2.8.0+cpu", "2.8.9", "1.13.1", "garbage"])
def test_a_torch_before_the_sharded_floor_is_named_with_the_version_needed(version: str) -> None:
    problem = sharded_support(version)
    assert problem is not None
    assert f"torch >= {SHARDED_TORCH[0]}.{SHARDED_TORCH[1]}" in problem and f"this is torch {version}" in problem


@pytest.mark.parametrize("version", ["2.9.0", "2.9.1+cpu", "2.13.0+cpu", "3.0.0"])
def test_a_torch_at_or_past_the_floor_can_train_a_sharded_model(version: str) -> None:
    assert sharded_support(version) is None


def _sharded_model() -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    fully_shard(net, mesh=placeholder_mesh())
    return net


def _job(net: nn.Module) -> ElasticJob:
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    env, ports = worker_env({}), Ports(process_hooks=False)
    return ElasticJob(net, opt, dataset=DATA, global_batch=4, micro_batch=2, env=env, ports=ports)


def test_a_plain_model_is_replicated_and_a_fully_shard_one_is_sharded() -> None:
    plain = nn.Linear(3, 1)
    assert not is_fully_sharded(plain)
    assert isinstance(_job(plain)._strategy, ReplicatedStrategy)
    sharded = _sharded_model()
    assert is_fully_sharded(sharded)
    job = _job(sharded)
    assert type(job._strategy).__name__ == "ShardedStrategy" and job._strategy.every_rank_saves
    job.close()


def test_a_fully_shard_model_on_an_older_torch_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    net = _sharded_model()
    monkeypatch.setattr(torch, "__version__", "2.8.0+cpu")
    with pytest.raises(ConfigError, match=r"^a fully_shard model needs torch >= 2\.9 .*; this is torch 2\.8\.0\+cpu$"):
        _job(net)


def test_a_fully_shard_model_takes_a_gradient_scaler_unless_disabled() -> None:
    opt = lambda net: torch.optim.SGD(net.parameters(), lr=0.1)  # noqa: E731
    env, ports = worker_env({}), Ports(process_hooks=False)
    args: dict[str, Any] = {"dataset": DATA, "global_batch": 4, "micro_batch": 2, "env": env, "ports": ports}
    net = _sharded_model()
    for enabled in (True, False):
        scaler = torch.amp.GradScaler("cpu", enabled=enabled)
        job = ElasticJob(net, opt(net), scaler=scaler, **args)
        held = job._strategy.held  # type: ignore[attr-defined]
        assert (held.scaling is not None and held.scaling.scaler is scaler) == enabled
        job.close()


def test_a_replicated_job_never_loads_the_sharded_path() -> None:
    """In a fresh interpreter: a whole replicated job (built, trained alone) imports no module of the sharded
    strategy; a fully_shard model then loads it. (torch loads its own FSDP modules when an optimizer first steps,
    so sys.modules cannot tell whether we imported them: `test_package_layout` checks that statically.)"""
    program = """
import json, sys, torch
from torch import nn
from slurm_elastic.worker import ElasticJob
from slurm_elastic.worker.env import worker_env
from slurm_elastic.worker.ports import Ports
def loaded():
    return sorted(m for m in sys.modules if m.startswith("slurm_elastic.worker.sharded"))
net = nn.Linear(3, 1)
data = [(torch.zeros(3), torch.zeros(1)) for _ in range(8)]
job = ElasticJob(net, torch.optim.SGD(net.parameters(), lr=0.1), dataset=data, global_batch=4, micro_batch=2,
                 env=worker_env({}), ports=Ports(process_hooks=False))
for x, y in job.micro_batches(2):
    job.backward(nn.functional.mse_loss(net(x), y))
after_replicated = loaded()
from slurm_elastic.worker import placeholder_mesh
from torch.distributed.fsdp import fully_shard
net = nn.Linear(3, 1)
fully_shard(net, mesh=placeholder_mesh())
ElasticJob(net, torch.optim.SGD(net.parameters(), lr=0.1), dataset=data, global_batch=4, micro_batch=2,
           env=worker_env({}), ports=Ports(process_hooks=False)).close()
print(json.dumps({"replicated": after_replicated, "steps": job.step, "sharded": loaded()}))
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["steps"] == 2  # the replicated job really trained
    assert seen["replicated"] == []
    assert "slurm_elastic.worker.sharded.strategy" in seen["sharded"]


@pytest.mark.parametrize("name", ["replicated", "sharded"])
def test_each_strategy_implements_the_whole_interface_with_its_signatures(name: str) -> None:
    """A third strategy is written from `worker.strategy` alone: each existing one has every member of the
    interface, with the interface's parameter names, so the interface is the whole contract."""
    import inspect

    from slurm_elastic.worker import strategy

    if name == "replicated":
        cls: type = ReplicatedStrategy
    else:
        from slurm_elastic.worker.sharded.strategy import ShardedStrategy

        cls = ShardedStrategy
    members = {n for n in vars(strategy.Strategy) if not n.startswith("_")} | set(strategy.Strategy.__annotations__)
    assert members >= {"begin", "backward", "finish", "commit", "abandon", "checkpoints", "held"}
    for member in sorted(members):
        interface = getattr(strategy.Strategy, member, None)
        if callable(interface):
            mine = getattr(cls, member, None)
            assert callable(mine), f"{cls.__name__} lacks {member}()"
            want = list(inspect.signature(interface).parameters)
            got = list(inspect.signature(mine).parameters)
            assert got == want, f"{cls.__name__}.{member}{got} differs from the interface's {want}"
        elif member != "held":  # an instance attribute, set by the constructor
            assert hasattr(cls, member), f"{cls.__name__} lacks {member}"
