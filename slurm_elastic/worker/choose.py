"""Which strategy trains a model: the sharded one for a `fully_shard` (FSDP2) model, the replicated one for any
other. The sharded strategy, and torch's private FSDP2 modules it builds on, are imported only for a sharded
model, and only on a torch that has what it needs.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

import torch

from slurm_elastic.errors import ConfigError
from slurm_elastic.worker.lossscale import LossScaling
from slurm_elastic.worker.phases import PhaseHooks
from slurm_elastic.worker.replicated.strategy import ReplicatedStrategy
from slurm_elastic.worker.settings import JobSettings
from slurm_elastic.worker.strategy import Report, Strategy

# FSDP2's custom all-gather and reduce-scatter (FSDPModule.set_custom_all_gather, torch 2.9): the sharded
# strategy runs FSDP2's collectives over its own groups through them, so that a lost peer fails a step
# instead of hanging it.
SHARDED_TORCH = (2, 9)


def torch_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string such as "2.13.0+cpu" or "2.9.0a0+git1234"; None if unreadable."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def sharded_support(version: str) -> str | None:
    """Why this torch cannot train a `fully_shard` model elastically; None when it can."""
    release = torch_release(version)
    if release is not None and release >= SHARDED_TORCH:
        return None
    need = ".".join(map(str, SHARDED_TORCH))
    return f"a fully_shard model needs torch >= {need} (FSDP2's custom collectives); this is torch {version}"


def is_fully_sharded(model: torch.nn.Module) -> bool:
    """Whether `fully_shard` ran on the model: its parameters are DTensors. Without importing anything: a model
    can hold a DTensor only once torch's DTensor module is loaded."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return dtensor is not None and any(isinstance(p, dtensor) for p in model.parameters())


def choose_strategy(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any | None,
    extra: dict[str, Any],
    settings: JobSettings,
    scaling: LossScaling | None,
    *,
    phases: PhaseHooks,
    change_requested: Callable[[], bool],
    report: Report,
) -> Strategy:
    if not is_fully_sharded(model):
        return ReplicatedStrategy(
            model, optimizer, scheduler, extra,
            reduce_dtype=settings.reduce_dtype, bucket_mb=settings.bucket_mb, clip=settings.clip_grad_norm,
            scaling=scaling, phases=phases, change_requested=change_requested,
        )  # fmt: skip
    problem = sharded_support(torch.__version__)
    if problem is None:
        try:
            from slurm_elastic.worker.sharded.strategy import ShardedStrategy
        except ImportError as exc:  # a build without the distributed modules, say
            problem = (
                f"a fully_shard model needs torch's FSDP2 modules, which this torch {torch.__version__} lacks: {exc}"
            )
    if problem is not None:
        raise ConfigError(problem)
    return ShardedStrategy(
        model, optimizer, scheduler, extra,
        reduce_dtype=settings.reduce_dtype_asked, clip=settings.clip_grad_norm, phases=phases,
        change_requested=change_requested, report=report, scaling=scaling,
    )  # fmt: skip


__all__ = ["SHARDED_TORCH", "choose_strategy", "is_fully_sharded", "sharded_support", "torch_release"]
