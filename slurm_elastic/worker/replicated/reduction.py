"""Gradient reduction in buckets, launched while the step's last backward still runs, as torch DDP does.

Parameters are grouped into buckets of about `bucket_mb` in reverse order of registration (backward
produces gradients roughly in that order). During the last micro-batch of a step, a bucket's sum over the
ranks starts as soon as the last of its gradients is ready; buckets start strictly in index order on every
rank, so collectives always match. Two ways to accumulate micro-batches:

- fast (`float32`, `bfloat16`): autograd accumulates each micro-batch's gradient, pre-scaled by its share
  of the step, straight into the bucket buffer (the parameters' `.grad` are views of it), as DDP's
  `no_sync` does; the sum goes on the wire in the reduce dtype (a bfloat16 copy for `bfloat16`).
- exact (`float64`): each micro-batch's gradient is added, scaled, into a float64 buffer, so the sum does
  not depend on how the ranks split the step: any world size and any recovery give the same bits.

The step's control data (its loss and a "membership change wanted" flag) rides in the last bucket. A
reducer whose collectives were abandoned never reuses their buffers (an abandoned sum may still write).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from slurm_elastic.errors import ConfigError, ElasticError
from slurm_elastic.worker.membership.comm import CollectiveFailed, Group, Interrupted

ReduceDtype = Literal["float32", "bfloat16", "float64"]
REDUCE_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
DEFAULT_BUCKET_MB = 25.0
CONTROL_SLOTS = 2  # [loss, change flag] at the end of the last bucket


def reduce_dtype_of(name: str) -> ReduceDtype:
    if name not in REDUCE_DTYPES:
        raise ConfigError(f"invalid reduce_dtype {name!r}: expected one of {', '.join(REDUCE_DTYPES)}")
    return name  # type: ignore[return-value]


@dataclass
class _Slot:
    param: torch.nn.Parameter
    offset: int  # in the bucket's buffer
    numel: int
    as_view: bool  # the parameter's .grad is a view of the accumulation buffer
    view: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # its part of the buffer, shaped like it
    address: int = 0  # view.data_ptr(), to recognise a .grad that is still our view


@dataclass
class _Bucket:
    index: int
    slots: list[_Slot]
    numel: int  # gradient elements, without control slots
    dtype: torch.dtype  # of the accumulation buffer
    control: bool  # holds the control slots
    acc: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # accumulated gradients (+ control)
    wire: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # what is summed (acc itself when it can)
    pending: int = 0  # gradients of the closing micro-batch not yet arrived
    work: Callable[[], None] | None = None  # waits for the bucket's sum


def _failed(exc: Exception) -> Callable[[], None]:
    def wait() -> None:
        raise exc

    return wait


def _plan_buckets(
    params: Sequence[torch.nn.Parameter], bucket_bytes: int, exact: bool, wire_dtype: torch.dtype
) -> list[_Bucket]:
    buckets: list[_Bucket] = []
    current: list[torch.nn.Parameter] = []
    size = 0

    def close() -> None:
        nonlocal current, size
        if current:
            dtype = torch.float64 if exact else current[0].dtype
            slots, offset = [], 0
            for p in current:
                as_view = not exact and p.is_contiguous()
                slots.append(_Slot(p, offset, p.numel(), as_view))
                offset += p.numel()
            buckets.append(_Bucket(len(buckets), slots, offset, dtype, False))
        current, size = [], 0

    for p in reversed(params):
        if current and (size >= bucket_bytes or (not exact and p.dtype != current[0].dtype)):
            close()
        current.append(p)
        size += p.numel() * wire_dtype.itemsize
    close()
    if buckets:
        buckets[-1].control = True
    return buckets


class GradientReducer:
    """Accumulates this rank's micro-batches and sums the step's gradients over the group, overlapped."""

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        reduce_dtype: ReduceDtype = "float32",
        *,
        bucket_mb: float = DEFAULT_BUCKET_MB,
        device: torch.device | None = None,
    ) -> None:
        if not bucket_mb > 0:
            raise ConfigError(f"invalid bucket_mb {bucket_mb!r}: expected a number > 0")
        self.params = list(params)
        self.reduce_dtype = reduce_dtype_of(reduce_dtype)
        self.exact = reduce_dtype == "float64"
        self.wire_dtype = REDUCE_DTYPES[reduce_dtype]
        self.device = device or (self.params[0].device if self.params else torch.device("cpu"))
        self.buckets = _plan_buckets(self.params, int(bucket_mb * 2**20), self.exact, self.wire_dtype)
        self._slot_of = {id(s.param): (b, s) for b in self.buckets for s in b.slots}
        self._group: Group | None = None
        self._weight = 1.0
        self._active = False  # inside a step attempt's backward
        self._closing = False  # the backward of this rank's last micro-batch of the step
        self._next_launch = 0
        self._launch_error: Exception | None = None  # a sum of this attempt that could not start
        self._on_launch: Callable[[int], None] = lambda index: None
        self._allocate()
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in self.params]

    @property
    def bucket_count(self) -> int:
        return len(self.buckets)

    # --- buffers --------------------------------------------------------------------------------------

    def _allocate(self) -> None:
        for b in self.buckets:
            extra = CONTROL_SLOTS if b.control else 0
            b.acc = torch.zeros(b.numel + extra, dtype=b.dtype, device=self.device)
            same = b.dtype == self.wire_dtype
            b.wire = b.acc if same else torch.zeros(b.numel + extra, dtype=self.wire_dtype, device=self.device)
            b.work = None
            for s in b.slots:
                s.view = b.acc[s.offset : s.offset + s.numel].view(s.param.shape)
                s.address = s.view.data_ptr()

    def abandon(self) -> None:
        """The group of these sums was abandoned: never touch its buffers again."""
        self._active = self._closing = False
        self._allocate()
        for p in self.params:
            p.grad = None

    # --- one step attempt -----------------------------------------------------------------------------

    def begin(self, group: Group | None, on_launch: Callable[[int], None] | None = None) -> None:
        """A step attempt starts: zero the accumulators; `on_launch(i)` runs after bucket i's sum starts."""
        self._group = group
        self._on_launch = on_launch or (lambda index: None)
        self._next_launch = 0
        self._launch_error = None
        self._active, self._closing = True, False
        for b in self.buckets:
            b.acc.zero_()
            b.work = None
            b.pending = len(b.slots)
            for s in b.slots:
                s.param.grad = s.view if s.as_view else None

    def backward(self, loss: torch.Tensor, weight: float, *, closing: bool) -> None:
        """Back-propagate one micro-batch's mean loss, weighted by its share of the step."""
        self._weight, self._closing = weight, closing
        if self.exact:
            loss.backward()
        else:
            (loss * weight).backward()
        if closing:
            self.launch_rest()

    def add_control(self, loss: torch.Tensor, weight: float, change_wanted: bool | None) -> None:
        """The step's weighted loss (every micro-batch) and, with the closing one, the change flag."""
        if not self.buckets:
            return
        ctrl = self.buckets[-1].acc[-CONTROL_SLOTS:]
        ctrl[:1].add_(loss.detach().reshape(1).to(ctrl), alpha=weight)  # no .item(): no device sync
        if change_wanted is not None:
            ctrl[1] = 1.0 if change_wanted else 0.0

    def _grad_ready(self, p: torch.Tensor) -> None:
        if not self._active:
            raise ElasticError("backward() ran outside a step: call step.backward(loss) (or job.backward(loss))")
        b, s = self._slot_of[id(p)]
        grad = p.grad
        assert grad is not None
        if self.exact:
            s.view.add_(grad, alpha=self._weight)
            p.grad = None
        elif not s.as_view or grad.data_ptr() != s.address:
            # Not our view (a non-contiguous parameter, or the user set .grad to None): fold it in.
            s.view.add_(grad)
            p.grad = s.view if s.as_view else None
        if self._closing:
            b.pending -= 1
            if b.pending == 0:
                self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next_launch < len(self.buckets) and self.buckets[self._next_launch].pending <= 0:
            self._launch(self.buckets[self._next_launch])

    def launch_rest(self) -> None:
        """Start every bucket not started yet, in order (parameters without a gradient contribute zeros)."""
        self._closing = True
        for b in self.buckets[self._next_launch :]:
            b.pending = 0
        self._launch_ready()

    def _launch(self, b: _Bucket) -> None:
        self._next_launch = b.index + 1
        if b.wire is not b.acc:
            b.wire.copy_(b.acc)
        if self._group is not None and self._launch_error is not None:
            b.work = _failed(self._launch_error)  # never start later sums: they would pair with the wrong ones
        elif self._group is not None:
            try:
                b.work = self._group.launch_allreduce(b.wire)
            except (CollectiveFailed, Interrupted) as exc:
                # Raised inside autograd's hook it would escape the user's backward(): fail the step at its wait.
                self._launch_error = exc
                b.work = _failed(exc)
        self._on_launch(b.index)

    def wait(self) -> tuple[float, bool]:
        """Wait for every bucket's sum; put the step's gradients in `.grad`; return (loss, change wanted)."""
        for b in self.buckets:
            if b.work is not None:
                b.work()
        self._active = self._closing = False
        for b in self.buckets:
            if b.wire is not b.acc:
                b.acc.copy_(b.wire)
            for s in b.slots:
                if s.as_view:
                    continue  # .grad already is the summed buffer
                s.param.grad = s.view.to(s.param.dtype) if self.exact else s.view.clone()
        if not self.buckets:
            return 0.0, False
        ctrl = self.buckets[-1].acc[-CONTROL_SLOTS:]
        return float(ctrl[0].item()), bool(ctrl[1].item() > 0)

    def after_optimizer(self) -> None:
        """Gradients the optimizer used are not kept outside the buffers (the exact mode's copies)."""
        for b in self.buckets:
            for s in b.slots:
                if not s.as_view:
                    s.param.grad = None

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def describe(self) -> dict[str, Any]:
        return {
            "reduce_dtype": self.reduce_dtype,
            "buckets": len(self.buckets),
            "bucket_elements": [b.numel for b in self.buckets],
        }
