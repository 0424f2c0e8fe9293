"""How a step's samples are split over the ranks of a generation, and how the learning rate follows.

The unit of work is a micro-batch with a fixed composition: the step's samples cut into pieces of
`micro_batch` samples (the last may be smaller). Whichever rank computes a micro-batch gets the same
gradient, so only the assignment of micro-batches to ranks depends on the world size. Each micro-batch's
mean loss is weighted by size / step_samples, so the summed gradient is exactly the mean over the step.

Two policies:
- `PreserveGlobalBatch`: the step always has `global_batch` samples; accumulation follows the world size.
- `ScaleLearningRate`: each rank keeps `per_replica_batch` samples; the step grows and shrinks with the
  world and the learning rate is scaled by the linear or square-root rule against `reference_world`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from slurm_elastic.errors import ConfigError

LrRule = Literal["linear", "sqrt"]


@dataclass(frozen=True)
class PreserveGlobalBatch:
    global_batch: int
    micro_batch: int

    def __post_init__(self) -> None:
        _positive("global_batch", self.global_batch)
        _positive("micro_batch", self.micro_batch)
        if self.micro_batch > self.global_batch:
            raise ConfigError(f"micro_batch {self.micro_batch} exceeds global_batch {self.global_batch}")


@dataclass(frozen=True)
class ScaleLearningRate:
    per_replica_batch: int
    micro_batch: int
    reference_world: int
    rule: LrRule = "linear"

    def __post_init__(self) -> None:
        _positive("per_replica_batch", self.per_replica_batch)
        _positive("micro_batch", self.micro_batch)
        _positive("reference_world", self.reference_world)
        if self.rule not in ("linear", "sqrt"):
            raise ConfigError(f"invalid lr rule {self.rule!r}: expected 'linear' or 'sqrt'")
        if self.micro_batch > self.per_replica_batch:
            raise ConfigError(f"micro_batch {self.micro_batch} exceeds per_replica_batch {self.per_replica_batch}")


BatchPolicy = PreserveGlobalBatch | ScaleLearningRate


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"invalid {name}: {value!r} (expected an integer >= 1)")


@dataclass(frozen=True)
class MicroBatch:
    index: int  # position within the step, fixed whatever the world size
    offset: int  # first sample, counted from the step's first sample
    size: int
    weight: float  # size / step_samples
    padding: bool = False  # a pass of weight 0 that keeps a sharded job's ranks in lockstep (`lockstep`)


@dataclass(frozen=True)
class StepPlan:
    world: int
    step_samples: int
    micro_batches: tuple[MicroBatch, ...]
    assignment: tuple[tuple[int, ...], ...]  # per rank, the indices of its micro-batches
    lr_factor: float
    reason: str

    def for_rank(self, rank: int) -> tuple[MicroBatch, ...]:
        return tuple(self.micro_batches[i] for i in self.assignment[rank])

    def samples_of(self, rank: int) -> int:
        return sum(mb.size for mb in self.for_rank(rank))

    def lockstep(self, rank: int) -> tuple[MicroBatch, ...]:
        """This rank's micro-batches, padded to as many passes as the busiest rank runs.

        A sharded (FSDP2) model gathers its parameters in every forward and scatters its gradients in every
        backward, collectives every rank must join; a rank with fewer micro-batches repeats one (its last, or
        the step's first) with weight 0, which adds nothing to the gradient and is not counted as data.
        """
        mine = self.for_rank(rank)
        rounds = max(len(block) for block in self.assignment)
        filler = mine[-1] if mine else self.micro_batches[0]
        pad = MicroBatch(filler.index, filler.offset, filler.size, 0.0, padding=True)
        return mine + (pad,) * (rounds - len(mine))


def _cut(total: int, piece: int) -> list[tuple[int, int]]:
    return [(start, min(piece, total - start)) for start in range(0, total, piece)]


def _balanced_blocks(count: int, world: int) -> tuple[tuple[int, ...], ...]:
    """Contiguous, as-even-as-possible blocks: rank r gets [r*count//world, (r+1)*count//world)."""
    return tuple(tuple(range(r * count // world, (r + 1) * count // world)) for r in range(world))


def plan_step(policy: BatchPolicy, world: int) -> StepPlan:
    if world < 1:
        raise ConfigError(f"invalid world size {world}: expected >= 1")
    if isinstance(policy, PreserveGlobalBatch):
        pieces = _cut(policy.global_batch, policy.micro_batch)
        total = policy.global_batch
        mbs = tuple(MicroBatch(i, off, size, size / total) for i, (off, size) in enumerate(pieces))
        assignment = _balanced_blocks(len(mbs), world)
        per_rank = [sum(mbs[i].size for i in block) for block in assignment]
        idle = sum(1 for n in per_rank if n == 0)
        reason = (
            f"preserve global batch {total}: {len(mbs)} micro-batches of <= {policy.micro_batch} over {world} "
            f"ranks, {min(per_rank)}-{max(per_rank)} samples per rank"
            + (f"; {idle} ranks idle (fewer micro-batches than ranks)" if idle else "")
        )
        return StepPlan(world, total, mbs, assignment, 1.0, reason)
    per_replica = _cut(policy.per_replica_batch, policy.micro_batch)
    total = policy.per_replica_batch * world
    mbs_list: list[MicroBatch] = []
    blocks: list[tuple[int, ...]] = []
    for r in range(world):
        first = len(mbs_list)
        for off, size in per_replica:
            mbs_list.append(MicroBatch(len(mbs_list), r * policy.per_replica_batch + off, size, size / total))
        blocks.append(tuple(range(first, len(mbs_list))))
    ratio = world / policy.reference_world
    factor = ratio if policy.rule == "linear" else math.sqrt(ratio)
    reason = (
        f"scale learning rate ({policy.rule}): {policy.per_replica_batch} samples per rank x {world} ranks = "
        f"{total}; lr x {factor:.4g} (reference world {policy.reference_world})"
    )
    return StepPlan(world, total, tuple(mbs_list), tuple(blocks), factor, reason)


def micro_batch_seed(seed: int, step: int, index: int) -> int:
    """A per-micro-batch RNG seed, so dropout draws do not depend on which rank runs the micro-batch."""
    mixed = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB) & (2**64 - 1)
    return mixed % (2**63 - 1)
