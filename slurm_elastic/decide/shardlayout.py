"""How a sharded (FSDP2) generation lays out its shards: one shard group over every rank with mirrors, or
HSDP replica groups.

A script asks for HSDP with the size of its shard groups (`placeholder_mesh(shard_group=S)`, S usually the
ranks of one node). Each generation cuts its W ranks into R = W / S' replica groups of S' consecutive
ranks, S' the smallest divisor of W that is at least S: no rank ever holds more than the script planned
for, whatever W a failure leaves (5 ranks with S = 2 form one group of 5). Rank r holds shard r % S' of
S'; the R ranks holding the same shard are its holders, as in torchft.

The second holder every shard needs on another node comes from the replicas when R >= 2 and the holders
of every shard span two nodes; otherwise the generation is one shard group over all W ranks, with mirrors
(`reshard.mirrors`), as a plain FSDP2 job. Pure: every rank derives the same layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurm_elastic.decide.reshard import Need, mirrors


@dataclass(frozen=True)
class Layout:
    """`shards` ranks per shard group, `world // shards` replica groups; wards when shards are mirrored."""

    world: int
    shards: int
    wards: tuple[int, ...] | None
    reason: str

    @property
    def replicas(self) -> int:
        return self.world // self.shards

    def index(self, rank: int) -> int:
        """The shard rank `rank` holds."""
        return rank % self.shards

    def replica(self, rank: int) -> int:
        """The replica group of rank `rank`."""
        return rank // self.shards

    def shard_group(self, rank: int) -> list[int]:
        """The ranks that shard the model together with `rank` (FSDP2's all-gathers and reduce-scatters)."""
        first = self.replica(rank) * self.shards
        return list(range(first, first + self.shards))

    def replica_group(self, rank: int) -> list[int]:
        """The ranks that hold the same shard as `rank` (the sum of their gradient shards)."""
        return list(range(self.index(rank), self.world, self.shards))

    def needs(self, members: Sequence[str]) -> list[Need]:
        """What each member (in rank order) must hold: its own shard, and its ward's."""
        out = [Need(m, self.shards, self.index(r), "primary") for r, m in enumerate(members)]
        if self.wards is not None:
            out += [Need(m, self.shards, self.wards[r], "mirror") for r, m in enumerate(members)]
        return out


def shard_group_size(world: int, wanted: int) -> int:
    """The smallest divisor of `world` that is at least `wanted` (`world` itself when none is smaller)."""
    if world < 1 or wanted < 1:
        raise ValueError(f"invalid world {world} or shard group {wanted}: expected both >= 1")
    return next(d for d in range(min(wanted, world), world + 1) if world % d == 0)


def plan_layout(nodes: Sequence[str], shard_group: int | None) -> Layout:
    """The layout of a generation whose ranks run on `nodes` (one entry per rank, in rank order)."""
    world = len(nodes)
    if shard_group is not None:
        shards = shard_group_size(world, shard_group)
        replicas = world // shards
        spread = all(len({nodes[r] for r in range(j, world, shards)}) >= 2 for j in range(shards))
        if replicas >= 2 and spread:
            return Layout(world, shards, None, f"HSDP: {replicas} replica groups of {shards} ranks")
        why = "one replica group" if replicas < 2 else "the replicas of a shard share a node"
        fallback = f"; HSDP with shard groups of {shard_group} would leave {why}"
    else:
        fallback = ""
    wards = mirrors(nodes)
    kind = "mirrored on other nodes" if wards is not None else "no second holder on another node"
    return Layout(world, world, wards, f"one shard group of {world} ranks, {kind}{fallback}")


__all__ = ["Layout", "plan_layout", "shard_group_size"]
