"""Pure measures of a run: time to recover from a kill, lost steps, and how far two models differ."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_elastic.eventtypes import Commit


@dataclass(frozen=True)
class Recovery:
    kill_time: float
    last_step_before: int  # the last step committed before the kill
    recovered_step: int | None  # the first step committed after it
    mttr_s: float | None  # kill -> commit of the step after `last_step_before`
    lost_steps: int = 0  # committed steps that had to be computed again


def recovery_after(kill_time: float, commits: Sequence[Commit]) -> Recovery:
    """Recovery is the first commit after the kill, of a step past the last one committed before it, that
    no later commit rolls back: a checkpoint-restart can commit the step in flight and then replay it."""
    before = [c.step for c in commits if c.worker_time <= kill_time]
    last = max(before, default=0)
    after = sorted((c for c in commits if c.worker_time > kill_time), key=lambda c: c.worker_time)
    durable: Commit | None = None
    lowest_later = math.inf
    for c in reversed(after):  # a commit is durable when every later commit is of a later step
        if c.step < lowest_later and c.step > last:
            durable = c
        lowest_later = min(lowest_later, c.step)
    lost = max(0, last - min((c.step for c in after), default=last + 1) + 1)
    if durable is None:
        return Recovery(kill_time, last, None, None, lost)
    return Recovery(kill_time, last, durable.step, durable.worker_time - kill_time, lost)


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


def tolerance(reduce_dtype: str, steps: int) -> float:
    """The largest `max_param_rel_diff` from an uninterrupted run that a gradient-sum mode promises.

    float64 (exact): any world size, fault or resize gives the same bits; 1e-6 leaves room only for a
    different CPU. float32 and bfloat16 sum in the order each world size gives, and AdamW magnifies that
    rounding over the steps. Measured on the char-LM example (uninterrupted runs at 2, 3 and 4 ranks):
    float32 differs by 1.2e-4 after 16 steps and 5.8e-3 after 300, about 2e-5 per step; the bound is five
    times that (at least 1e-3), and ten times more for bfloat16's coarser sums (docs/reduction.md).
    """
    if reduce_dtype == "float64":
        return 1e-6
    bound = max(1e-3, 1e-4 * steps)
    return bound * 10 if reduce_dtype == "bfloat16" else bound
