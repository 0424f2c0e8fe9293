"""A DDP habit kept: `optimizer.zero_grad()` and `optimizer.step()` may stay in the script's loop.

Inside an ElasticJob's loop the job steps the optimizer itself, once per committed step (when the whole
global batch is summed), so the script's own calls there do nothing, as in gradient-accumulation
wrappers (HF Accelerate's optimizer skips them the same way). Outside the loop they act as usual. The
job keeps the real `step` for itself.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch


def guard_optimizer(
    optimizer: torch.optim.Optimizer, in_loop: Callable[[], bool], ignored: Callable[[str], None]
) -> Callable[[], Any]:
    """Make the script's step/zero_grad no-ops while `in_loop()`; returns the real step for the job."""
    real_step = optimizer.step
    real_zero_grad = optimizer.zero_grad

    def step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        if in_loop():
            ignored("optimizer.step")
            return None
        return real_step(*args, **kwargs)

    def zero_grad(self: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        if in_loop():
            ignored("optimizer.zero_grad")
            return
        real_zero_grad(set_to_none)

    if hasattr(real_step, "_wrapped_by_lr_sched"):
        # An LR scheduler built before the job checks its mark on `step` (else it warns at every step that
        # `step` was overridden); the job's real step still goes through the scheduler's wrapper.
        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    # Bound methods (not plain functions): an LR scheduler built later wraps `step` through `__func__`.
    optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
    optimizer.zero_grad = types.MethodType(zero_grad, optimizer)  # type: ignore[method-assign]
    return real_step
