"""Pure measures of a run: time to recover from a kill, lost steps, and how far two models differ."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


class CommitLike(Protocol):
    @property
    def step(self) -> int: ...

    @property
    def worker_time(self) -> float: ...


@dataclass(frozen=True)
class Recovery:
    kill_time: float
    last_step_before: int  # the last step committed before the kill
    recovered_step: int | None  # the first step committed after it
    mttr_s: float | None  # kill -> commit of the step after `last_step_before`


def recovery_after(kill_time: float, commits: Sequence[CommitLike]) -> Recovery:
    before = [c.step for c in commits if c.worker_time <= kill_time]
    last = max(before, default=0)
    after = [c for c in commits if c.worker_time > kill_time and c.step > last]
    if not after:
        return Recovery(kill_time, last, None, None)
    first = min(after, key=lambda c: c.worker_time)
    return Recovery(kill_time, last, first.step, first.worker_time - kill_time)


def median(values: Sequence[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def max_param_rel_diff(got: Mapping[str, object], ref: Mapping[str, object]) -> float:
    """max over tensors of max|got - ref| / max|ref|: 0 for identical models, scale-free otherwise."""
    import torch

    if set(got) != set(ref):
        raise ValueError(f"models differ in their tensors: {sorted(set(got) ^ set(ref))[:5]}")
    worst = 0.0
    for name, r in ref.items():
        a, b = torch.as_tensor(got[name]).double(), torch.as_tensor(r).double()
        scale = b.abs().max().item() if b.numel() else 0.0
        diff = (a - b).abs().max().item() if b.numel() else 0.0
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
        worst = max(worst, rel)
    return worst
