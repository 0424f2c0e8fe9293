"""Sharded data-parallel training of a `fully_shard` (FSDP2) model: FSDP2 sums the gradients (its
reduce-scatters, run over the generation's group), each rank's shard is also held by a second rank (its
mirror), and the step commits in two phases with the mirror (see `decide.heal`).

Every rank runs the same number of forward and backward passes per step, because FSDP2's all-gathers and
reduce-scatters are collectives: a rank with fewer micro-batches than its peers runs padding passes of
weight zero (`decide.batching.lockstep`). After the last backward (the shards must be as the last commit
left them: a write by the script in between, such as a load of its own checkpoint, is refused):

1. each rank sends its gradient shard to the rank mirroring it, and receives its ward's ("prepared");
   with HSDP replica groups (`decide.shardlayout`) it instead sums its gradient shard over the ranks that hold
   the same shard (FSDP2's reduce-scatter ran inside its shard group);
2. one small sum over the ranks: the step's loss, the "membership change wanted" flag, the number of
   clean ranks, the squared gradient norm (for clipping) and, with float16's gradient scaler, the number
   of ranks whose (unscaled) gradient shard overflowed;
3. if every rank was clean, the optimizer updates the own shard and the mirrored one (unless a shard
   overflowed: then every rank skips the update alike, and the scale backs off): committed.

A rank whose FSDP2 collective failed or was interrupted (poisoned) skips 1 and 2: no rank commits the
step, and the new generation re-runs it.

This module and torch's private FSDP2 modules under it are imported only for a `fully_shard` model
(`worker.choose`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from slurm_elastic.decide.batching import MicroBatch, StepPlan
from slurm_elastic.errors import ConfigError
from slurm_elastic.logs import get_logger
from slurm_elastic.worker.checkpoints.ckptfiles import CheckpointError
from slurm_elastic.worker.lossscale import LossScaling
from slurm_elastic.worker.membership.comm import CollectiveFailed, Group
from slurm_elastic.worker.phases import PhaseHooks
from slurm_elastic.worker.sharded.checkpoint import ShardedCheckpoints, complete_checkpoints, save_snapshot
from slurm_elastic.worker.sharded.collectives import StepCollectives
from slurm_elastic.worker.sharded.holder import ShardedReplica
from slurm_elastic.worker.sharded.remesh import shard_group_wanted
from slurm_elastic.worker.sharded.sync import synchronize_sharded
from slurm_elastic.worker.strategy import Report, SyncResult

log = get_logger("slurm_elastic.worker")


class ShardedStrategy:
    every_rank_saves = True
    reduce_dtype = "float32"  # FSDP2 sums in float32

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any | None,
        extra: dict[str, Any],
        *,
        reduce_dtype: str | None,
        clip: float | None,
        phases: PhaseHooks,
        change_requested: Callable[[], bool],
        report: Report,
        scaling: LossScaling | None = None,
    ) -> None:
        if reduce_dtype not in (None, "float32"):
            raise ConfigError(f"invalid reduce_dtype {reduce_dtype!r} for a fully_shard model: FSDP2 sums in float32")
        self._scaling = scaling if scaling is not None and scaling.enabled else None
        held = ShardedReplica(model, optimizer, scheduler, extra, phases=phases, scaling=self._scaling)
        held.clip = clip
        held.shard_group_wanted = shard_group_wanted(model)
        held.on_refused = lambda line: report("shard_refused", {"detail": line, "step": held.step})  # one event each
        self.held = held
        self._phases = phases
        self._change_requested = change_requested
        self._loss = torch.zeros((), dtype=torch.float64)
        self._norm2 = 0.0
        self._overflowed = False  # a rank's gradient shard held an inf or NaN this step (float16's scaler)
        self._group: Group | None = None
        self._number = 0

    def micro_batches(self, plan: StepPlan, rank: int) -> tuple[MicroBatch, ...]:
        return plan.lockstep(rank)  # every rank runs as many passes (FSDP2's collectives pair them up)

    def begin(self, group: Group | None, number: int) -> None:
        assert group is not None  # a sharded job always runs in a generation's group (of one, alone)
        self._group, self._number = group, number
        self._loss = torch.zeros((), dtype=torch.float64)
        phases = self._phases
        hit = lambda kind: phases.fire("reduce_scatter", number) if kind == "reduce-scatter" else None  # noqa: E731
        self.held.begin(StepCollectives(self.held.shards or group, hit))

    def backward(self, loss: torch.Tensor, mb: MicroBatch, last: bool) -> None:
        self._phases.fire("backward", self._number)  # parameters are re-made per generation: no autograd hook
        if mb.weight:
            self._loss += loss.detach().double().cpu() * mb.weight
        scaled = self._scaling.scale(loss) if self._scaling is not None else loss
        (scaled * mb.weight).backward()

    def contribute_nothing(self) -> None:
        raise AssertionError("a sharded job's ranks always run passes (lockstep): none is without a micro-batch")

    def finish(self) -> tuple[float, bool]:
        """Phases 1 and 2. Raises CollectiveFailed when this rank or any other could not complete the step."""
        group, held = self._group, self.held
        assert group is not None and held.collectives is not None
        poison = held.collectives.poison
        if poison is not None:
            raise CollectiveFailed(poison)
        held.check_sealed()
        own = held.grads()
        if held.replicas is not None and held.replicas.world > 1:
            _sum_over(held.replicas, own)  # HSDP: each replica group reduced its own micro-batches
        # Unscaled before the mirror gets its copy and before the norm (clipping sees true gradients).
        finite = self._scaling.unscale_shards(own) if self._scaling is not None else True
        mirror: list[torch.Tensor] | None = None
        wards = held.wards
        if wards is not None and group.world > 1:
            buddy = wards.index(group.rank)  # the rank that mirrors this rank's shard
            like = list(held.mirror_params.values())  # shaped like the ward's gradient rows
            outgoing = _pack(own)
            incoming = torch.empty(sum(t.numel() * t.element_size() for t in like), dtype=torch.uint8)
            group.exchange([(outgoing, buddy, 8)], [(incoming, wards[group.rank], 8)])
            mirror = _unpack(incoming, like)
        held.prepare(self._number, own, mirror)
        # Only clipping needs the norm: a pass over every gradient shard in float64 otherwise for nothing.
        counted = held.first_replica and held.clip is not None  # each shard counted once
        norm2 = held.local_norm2(own) if counted else 0.0
        change = 1.0 if self._change_requested() else 0.0
        control = torch.tensor([float(self._loss), change, 1.0, norm2, 0.0 if finite else 1.0], dtype=torch.float64)
        group.allreduce_(control)
        if int(control[2].item()) != group.world:
            raise CollectiveFailed(f"step {self._number}: {group.world - int(control[2].item())} ranks were not clean")
        self._norm2 = float(control[3].item())
        self._overflowed = control[4].item() > 0
        return float(control[0].item()), bool(control[1].item() > 0)

    def commit(self, number: int, plan: StepPlan) -> None:
        self._phases.fire("optimizer", number)  # the job steps the shards, not the script's optimizer
        self._phases.fire("commit", number)
        skip = self._scaling is not None and self._overflowed
        self.held.commit(number, plan.step_samples, self._norm2, self.held.clip, plan.lr_factor, skip=skip)
        if self._scaling is not None:
            if skip:
                log.info("overflow_step_skipped", step=number, scale=self._scaling.scaler.get_scale())
            self._scaling.update_agreed(skip)

    def abandon(self) -> None:
        pass  # a poisoned attempt's collectives return at once; the next attempt installs fresh ones

    def heal(
        self, group: Group, store: Any, key_prefix: str, members: list[str], before_transfer: Callable[[], None]
    ) -> SyncResult:
        """Hold this rank's shards of the generation's layout at the generation's step (`sharded.sync`)."""
        return synchronize_sharded(self.held, group, store, key_prefix, members, before_transfer)

    def start_alone(self, group: Group, member: str) -> None:
        if self.held.checkpoint_dir is not None:  # read, re-sharded to this world, as a generation would
            synchronize_sharded(self.held, group, None, "", [member])

    def checkpoints(
        self, directory: Path, every: int, background: bool, report: Report, keep: int
    ) -> ShardedCheckpoints:
        return ShardedCheckpoints(directory, every, background, report, keep)

    def save(self, path: Path) -> None:
        """Every rank calls it; the ranks of the first replica group each write their shard under `path`, as
        the job's own checkpoints are written, so the snapshot loads at any world size."""
        save_snapshot(path, self.held)

    def resume(self, path: Path) -> None:
        """A sharded snapshot is used only once every shard of it was written; it is read, re-sharded to the
        world, when the first generation forms."""
        found = complete_checkpoints(path)
        if not found:
            raise CheckpointError(
                f"{path} holds no complete sharded snapshot: a fully_shard job's save() must run on every rank"
            )
        self.held.checkpoint_dir = path
        log.info("resuming_from_snapshot", path=str(path), step=found[-1][0], saved_world=found[-1][1])

    def generation_fields(self) -> dict[str, Any]:
        held = self.held
        fields: dict[str, Any] = {"strategy": "fsdp2", "mirrors": held.wards is not None}
        if held.layout is not None:
            fields |= {"shard_group": held.layout.shards, "replica_groups": held.layout.replicas}
        return fields

    def hook_backward_phase(self) -> None:
        pass  # `backward` fires it


def _sum_over(group: Group, tensors: list[torch.Tensor]) -> None:
    """Sum each tensor over `group`, in place: one sum per dtype."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for same in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in same])
        group.allreduce_(flat)
        offset = 0
        for t in same:
            t.copy_(flat[offset : offset + t.numel()].view(t.shape))
            offset += t.numel()


def _pack(tensors: list[torch.Tensor]) -> torch.Tensor:
    parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)


def _unpack(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out, offset = [], 0
    for t in like:
        size = t.numel() * t.element_size()
        chunk = flat[offset : offset + size]
        if offset % t.element_size():
            chunk = chunk.clone()  # a dtype view needs an aligned start
        out.append(chunk.view(t.dtype).view(t.shape))
        offset += size
    return out


__all__ = ["ShardedStrategy"]
