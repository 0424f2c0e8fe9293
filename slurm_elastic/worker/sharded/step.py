"""ElasticJob's step for a `fully_shard`-ed model: FSDP2 sums the gradients (its reduce-scatters, run over the
generation's group), and the step commits in two phases with the mirror (see `decide.heal`).

Every rank runs the same number of forward and backward passes per step, because FSDP2's all-gathers and
reduce-scatters are collectives: a rank with fewer micro-batches than its peers runs padding passes of
weight zero (`decide.batching.lockstep`). After the last backward:

1. each rank sends its gradient shard to the rank mirroring it, and receives its ward's ("prepared");
   with HSDP replica groups (`decide.layout`) it instead sums its gradient shard over the ranks that hold
   the same shard (FSDP2's reduce-scatter ran inside its shard group);
2. one small sum over the ranks: the step's loss, the "membership change wanted" flag, the number of
   clean ranks and the squared gradient norm (for clipping);
3. if every rank was clean, the optimizer updates the own shard and the mirrored one: committed.

A rank whose FSDP2 collective failed or was interrupted (poisoned) skips 1 and 2: no rank commits the
step, and the new generation re-runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from slurm_elastic.errors import ConfigError
from slurm_elastic.worker.comm import CollectiveFailed, Group
from slurm_elastic.worker.phases import PhaseHooks
from slurm_elastic.worker.sharded.collectives import StepCollectives
from slurm_elastic.worker.sharded.holder import ShardedReplica
from slurm_elastic.worker.sharded.remesh import is_sharded, shard_group_wanted
from slurm_elastic.worker.sharded.sync import synchronize_sharded

Report = Callable[[str, dict[str, Any]], None]


def sharded_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any | None,
    extra: dict[str, Any],
    reduce_dtype: str | None,
    clip: float | None,
    phases: PhaseHooks,
) -> ShardedStep | None:
    """The step of a `fully_shard`-ed model (None for any other model), its settings checked now."""
    if not is_sharded(model):
        return None
    if reduce_dtype not in (None, "float32"):
        raise ConfigError(f"invalid reduce_dtype {reduce_dtype!r} for a fully_shard model: FSDP2 sums in float32")
    replica = ShardedReplica(model, optimizer, scheduler, extra, synchronizer=synchronize_sharded, phases=phases)
    replica.clip = clip
    replica.shard_group_wanted = shard_group_wanted(model)
    return ShardedStep(replica)


class ShardedStep:
    def __init__(self, replica: ShardedReplica) -> None:
        self.replica = replica
        self._loss = torch.zeros((), dtype=torch.float64)
        self._group: Group | None = None
        self._number = 0

    def attach(self, report: Report) -> None:
        """Refused copies become events."""
        self.replica.on_refused = lambda line: report("shard_refused", {"detail": line, "step": self.replica.step})

    def begin(self, group: Group, number: int, on_collective: Callable[[str], None]) -> None:
        self._group, self._number = group, number
        self._loss = torch.zeros((), dtype=torch.float64)
        self.replica.begin(StepCollectives(self.replica.shards or group, on_collective))

    def backward(self, loss: torch.Tensor, weight: float) -> None:
        if weight:
            self._loss += loss.detach().double().cpu() * weight
        (loss * weight).backward()

    def finish(self, change_wanted: bool) -> tuple[float, bool, float]:
        """Phases 1 and 2: (the step's loss, whether a membership change is wanted, the squared gradient norm).
        Raises CollectiveFailed when this rank or any other could not complete the step."""
        group, replica = self._group, self.replica
        assert group is not None and replica.collectives is not None
        poison = replica.collectives.poison
        if poison is not None:
            raise CollectiveFailed(poison)
        own = replica.grads()
        if replica.replicas is not None and replica.replicas.world > 1:
            _sum_over(replica.replicas, own)  # HSDP: each replica group reduced its own micro-batches
        mirror: list[torch.Tensor] | None = None
        wards = replica.wards
        if wards is not None and group.world > 1:
            buddy = wards.index(group.rank)  # the rank that mirrors this rank's shard
            like = list(replica.mirror_params.values())  # shaped like the ward's gradient rows
            outgoing = _pack(own)
            incoming = torch.empty(sum(t.numel() * t.element_size() for t in like), dtype=torch.uint8)
            group.exchange([(outgoing, buddy, 8)], [(incoming, wards[group.rank], 8)])
            mirror = _unpack(incoming, like)
        replica.prepare(self._number, own, mirror)
        # Only clipping needs the norm: a pass over every gradient shard in float64 otherwise for nothing.
        counted = replica.first_replica and replica.clip is not None  # each shard counted once
        norm2 = replica.local_norm2(own) if counted else 0.0
        control = torch.tensor([float(self._loss), 1.0 if change_wanted else 0.0, 1.0, norm2], dtype=torch.float64)
        group.allreduce_(control)
        if int(control[2].item()) != group.world:
            raise CollectiveFailed(f"step {self._number}: {group.world - int(control[2].item())} ranks were not clean")
        return float(control[0].item()), bool(control[1].item() > 0), float(control[3].item())

    def commit(self, samples: int, norm2: float, lr_factor: float) -> None:
        self.replica.commit(self._number, samples, norm2, self.replica.clip, lr_factor)


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


__all__ = ["ShardedStep", "sharded_step"]
