"""FSDP2's all-gathers and reduce-scatters, run over the library's group of the current generation.

FSDP2 calls them inside the user's forward and inside autograd's backward, where an exception would escape
the user's own code. So a collective that fails (a peer died, the group broke) or is interrupted (a newer
generation was announced) does not raise: it fills its output with zeros and poisons the step. Every
later collective of the step returns at once (starting it would pair it with the wrong one on a peer), the
rank runs to the end of its micro-batches on garbage, and the step's commit sees the poison and fails the
attempt: the parameters were not touched, and the new generation re-runs the same samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from slurm_elastic.worker.membership.comm import CollectiveFailed, Group, Interrupted


class StepCollectives:
    """The collectives of one rank's step attempts in one generation; `poison` says why the attempt failed."""

    def __init__(self, group: Group, on_start: Callable[[str], None] | None = None) -> None:
        self.group = group
        self.poison: str | None = None
        self.count = 0
        self._on_start = on_start or (lambda kind: None)

    def _run(self, kind: str, output: torch.Tensor, start: Callable[[], Callable[[], None]]) -> None:
        if self.poison is not None:
            output.zero_()
            return
        self.count += 1
        try:
            wait = start()
            self._on_start(kind)
            wait()
        except (Interrupted, CollectiveFailed) as exc:
            self.poison = f"{kind} {self.count} of generation {self.group.generation}: {exc}"
            output.zero_()

    def all_gather(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        if self.group.world == 1:
            output.copy_(tensor.reshape(output.shape))
            return
        self._run("all-gather", output, lambda: self.group.launch_all_gather(output, tensor))

    def reduce_scatter(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        if self.group.world == 1:
            output.copy_(tensor.reshape(output.shape))
            return
        self._run("reduce-scatter", output, lambda: self.group.launch_reduce_scatter(output, tensor))


class _Alloc:
    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class _AllGather(_Alloc, AllGather):
    def __init__(self, steps: Callable[[], StepCollectives]) -> None:
        self._steps = steps

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, async_op: bool = False
    ) -> None:
        self._steps().all_gather(output_tensor, input_tensor)


class _ReduceScatter(_Alloc, ReduceScatter):
    def __init__(self, steps: Callable[[], StepCollectives]) -> None:
        self._steps = steps

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> None:
        self._steps().reduce_scatter(output_tensor, input_tensor)


def fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def install(model: torch.nn.Module, steps: Callable[[], StepCollectives]) -> None:
    """Route every FSDP2 module's collectives through `steps()` (the current generation's), as plain sums:
    the library weights each micro-batch's loss by its share of the step, so nothing is divided."""
    gather, scatter = _AllGather(steps), _ReduceScatter(steps)
    for module in fsdp_modules(model):
        module.set_custom_all_gather(gather)
        module.set_custom_reduce_scatter(scatter)
        module.set_gradient_divide_factor(1.0)


__all__ = ["StepCollectives", "fsdp_modules", "install"]
