"""The seam between the training loop and the kind of data-parallel training a job does.

`ElasticJob` runs the loops, the generations, the data and the ledger the same way for every model; a
`Strategy` does what differs: how gradients are summed and the optimizer steps, what state a rank holds and
how peers heal it, how it is checkpointed. Two exist: `worker.replicated` (every rank holds the whole model)
and `worker.sharded.strategy` (a `fully_shard` model, each shard held twice). `worker.choose` picks one per
model. A third kind of training is a third class with these methods; nothing else in the worker changes.

The order of the calls for one step attempt, on every rank of a generation:

    begin(group, number)
    backward(loss, mb, last)       for each of `micro_batches(plan, rank)`, or
    contribute_nothing()           when that tuple is empty (more ranks than micro-batches)
    finish() -> (loss, change)     the step's sums completed on every rank, or CollectiveFailed
    commit(number, plan)           the optimizer step: the step is committed on this rank

and `abandon()` whenever an attempt is given up (a failure, a new generation). As each generation forms, the
runtime calls `heal(...)` on every member: they end holding the same committed state, from their peers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from slurm_elastic.decide.batching import MicroBatch, StepPlan
from slurm_elastic.worker.checkpoints.state import Snapshot
from slurm_elastic.worker.membership.comm import Group

Report = Callable[[str, dict[str, Any]], None]  # kind, fields: one structured event about this worker


@dataclass(frozen=True)
class SyncResult:
    """How a generation got in sync (the fields of its `generation_ready` event)."""

    target_step: int
    sources: tuple[int, ...]
    receivers: tuple[int, ...]
    reason: str
    bytes_moved: int  # by all ranks together (each rank planned the same transfers)
    seconds: float
    received: Snapshot | None = None


class Held(Protocol):
    """The training state a rank holds (a full replica, or its shards): what recovery and the loop need of it."""

    step: int  # committed optimizer steps
    cursor: int  # committed position in the global sample stream
    fresh: bool  # holds no committed state yet (a joiner before its first transfer)
    reference_world: int | None
    global_batch: int | None
    step_fn: Callable[[], Any]  # the optimizer's real step (the script's own call may be a no-op)


class Checkpoints(Protocol):
    """Disaster-recovery checkpoints of what a strategy holds."""

    def load_into(self, replica: Any) -> bool: ...

    def after_commit(self, replica: Any, rank: int) -> None: ...

    def save_now(self, replica: Any) -> None: ...

    def close(self) -> None: ...


class Strategy(Protocol):
    """What differs between one kind of data-parallel training and another (see the module's docstring)."""

    every_rank_saves: bool  # each rank writes its own part of a checkpoint (else rank 0 writes it whole)

    @property
    def held(self) -> Held:
        """What this rank holds: the model's state as this strategy keeps it."""
        ...

    @property
    def reduce_dtype(self) -> str:
        """The dtype gradients are summed in."""
        ...

    def micro_batches(self, plan: StepPlan, rank: int) -> tuple[MicroBatch, ...]:
        """This rank's micro-batches of a step (a strategy whose ranks run in lockstep pads them)."""
        ...

    def begin(self, group: Group | None, number: int) -> None:
        """Step attempt `number` starts over the generation's group (None: this rank is alone)."""
        ...

    def backward(self, loss: torch.Tensor, mb: MicroBatch, last: bool) -> None:
        """Back-propagate one micro-batch's mean loss, weighted by its share of the step; `last`: the step's last
        on this rank, after which its sums may complete."""
        ...

    def contribute_nothing(self) -> None:
        """This rank has no micro-batch in the step but takes part in its sums."""
        ...

    def finish(self) -> tuple[float, bool]:
        """Wait for the step's sums: (the step's mean loss over the whole global batch, whether any rank wants
        a membership change). Raises CollectiveFailed or Interrupted when this rank or another fell short."""
        ...

    def commit(self, number: int, plan: StepPlan) -> None:
        """The optimizer and scheduler step, then `held` is at step `number` with the step's samples consumed."""
        ...

    def abandon(self) -> None:
        """The attempt is given up: nothing of it may touch the next one."""
        ...

    def heal(
        self, group: Group, store: Any, key_prefix: str, members: list[str], before_transfer: Callable[[], None]
    ) -> SyncResult:
        """A generation formed over `group`: every member ends holding the same committed state, the newest any
        of them holds, taken from peers (never from disk: a strategy that must read its checkpoint raises
        `StateLost`). The generation's store serves what the members publish under `key_prefix`;
        `before_transfer()` runs once a transfer is planned (a fault's "transfer" phase)."""
        ...

    def start_alone(self, group: Group, member: str) -> None:
        """No coordinator: this process is the whole job, and its first (and only) generation starts."""
        ...

    def checkpoints(self, directory: Path, every: int, background: bool, report: Report, keep: int) -> Checkpoints:
        """The job's disaster-recovery checkpoints for what this strategy holds."""
        ...

    def save(self, path: Path) -> None:
        """The script's snapshot (`job.save(path)`)."""
        ...

    def resume(self, path: Path) -> None:
        """Start from the script's snapshot at `path` (`resume_from=`); the path exists."""
        ...

    def generation_fields(self) -> dict[str, Any]:
        """What a `generation_ready` event says of how this strategy trains."""
        ...

    def hook_backward_phase(self) -> None:
        """The "backward" phase has a hook attached: fire it inside autograd where the strategy can."""
        ...


__all__ = ["Checkpoints", "Held", "Report", "Strategy", "SyncResult"]
