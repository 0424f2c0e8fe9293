"""Who sends which rows of which sharded tensor to whom when a sharded (FSDP2) job changes its world size.

FSDP2 cuts every tensor along dim 0 as `torch.chunk` does: shards of ceil(n / world) rows, so the last
shards may be shorter or empty (7 rows over 3 ranks: 3, 3, 1; 5 rows over 4: 2, 2, 1, 0). Each shard is
held twice (its rank's own copy and a mirror on another node, see `mirrors`), possibly cut for an older
world size than the one being formed. `plan_reshard` takes what every live holder holds and what every
member of the new generation needs, and returns, per tensor, a partition of every needed row range into
pieces with one source each:

- a member that already holds rows takes them from itself (a local copy, nothing on the wire);
- rows two live holders can serve are split between them, so a heal or a join spreads its load;
- rows no live holder has are reported as lost: the caller must not resume from partial state.

Pure: no torch, no clock. Every rank derives the same plan from the same inputs.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Role = Literal["primary", "mirror"]


def shard_rows(n: int, world: int, index: int) -> tuple[int, int]:
    """Rows [lo, hi) of an n-row tensor that shard `index` of `world` holds (FSDP2's dim-0 rule)."""
    if world < 1 or not 0 <= index < world or n < 0:
        raise ValueError(f"invalid shard {index} of world {world} for {n} rows: expected 0 <= index < world, n >= 0")
    size = -(-n // world)
    lo = min(index * size, n)
    return lo, min(lo + size, n)


def mirrors(nodes: Sequence[str]) -> tuple[int, ...] | None:
    """For each rank, the shard it mirrors (its ward), held on another node; None when impossible.

    Ranks are grouped by node, the largest group first, and each rank mirrors the rank `m` places before it
    in that order, `m` being the largest group's size: a permutation with no rank mirroring a shard of its
    own node whenever no node holds more than half the ranks (otherwise no such permutation exists).
    """
    world = len(nodes)
    groups: dict[str, list[int]] = defaultdict(list)
    for rank, node in enumerate(nodes):
        groups[node].append(rank)
    if world < 2 or 2 * max(len(g) for g in groups.values()) > world:
        return None
    order = [r for _, g in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])) for r in g]
    shift = max(len(g) for g in groups.values())
    ward = [0] * world
    for i, rank in enumerate(order):
        ward[rank] = order[(i - shift) % world]
    return tuple(ward)


@dataclass(frozen=True, order=True)
class Holding:
    """`holder` holds shard `index` of a `world`-way layout of every tensor, at the step being resumed."""

    holder: str
    world: int
    index: int


@dataclass(frozen=True, order=True)
class Need:
    """`member` must end holding shard `index` of the new `world`-way layout, as its `role` copy."""

    member: str
    world: int
    index: int
    role: Role = "primary"


@dataclass(frozen=True, order=True)
class Piece:
    """Rows [lo, hi) of tensor `tensor` go from `src` to `dst`'s `role` copy (`src == dst`: a local copy)."""

    tensor: int
    dst: str
    role: Role
    lo: int
    hi: int
    src: str

    @property
    def local(self) -> bool:
        return self.src == self.dst


@dataclass(frozen=True)
class Lost:
    tensor: int
    lo: int
    hi: int


@dataclass(frozen=True)
class ReshardPlan:
    pieces: tuple[Piece, ...]
    lost: tuple[Lost, ...]
    load: tuple[tuple[str, int], ...]  # bytes each holder sends to others (local copies excluded), by holder
    reason: str

    @property
    def complete(self) -> bool:
        return not self.lost

    def sends_from(self, holder: str) -> tuple[Piece, ...]:
        return tuple(p for p in self.pieces if p.src == holder and not p.local)

    def receives_of(self, member: str) -> tuple[Piece, ...]:
        return tuple(p for p in self.pieces if p.dst == member)

    @property
    def bytes_moved(self) -> int:
        return sum(b for _, b in self.load)


def _segments(lo: int, hi: int, cuts: Iterable[int]) -> list[tuple[int, int]]:
    points = sorted({lo, hi, *(c for c in cuts if lo < c < hi)})
    return list(itertools.pairwise(points))


def plan_reshard(
    rows: Sequence[int],
    row_bytes: Sequence[int],
    holdings: Iterable[Holding],
    needs: Iterable[Need],
    *,
    split_bytes: int = 1 << 20,
) -> ReshardPlan:
    """Cover every row each need asks for, from live holdings; see the module's docstring.

    `rows[t]` and `row_bytes[t]` describe tensor t. A segment of at least `2 * split_bytes` that several
    holders can serve is split evenly between them; smaller ones go whole to the least loaded of them.
    """
    if len(rows) != len(row_bytes):
        raise ValueError(f"rows ({len(rows)} tensors) and row_bytes ({len(row_bytes)}) must describe the same tensors")
    if split_bytes < 1:
        raise ValueError(f"invalid split_bytes {split_bytes}: expected >= 1")
    held = sorted(set(holdings))
    wanted = sorted(set(needs))
    load: dict[str, int] = {h.holder: 0 for h in held}
    pieces: list[Piece] = []
    lost: list[Lost] = []
    # (bytes, tensor, need, lo, hi, candidates). Balanced greedily, in an order that leaves each choice as
    # much known load as it can: first the segments one holder alone can serve (no choice), then the large
    # segments split between their holders, then the rest whole, largest first.
    Segment = tuple[int, int, Need, int, int, tuple[str, ...]]
    split: list[Segment] = []
    pending: list[Segment] = []
    covers: dict[int, list[tuple[Need, int, int, tuple[str, ...]]]] = {}
    for t, (n, rb) in enumerate(zip(rows, row_bytes, strict=True)):
        if n not in covers:  # tensors of the same length are cut alike: their segments are found once
            covers[n] = _cover(n, held, wanted)
        for need, a, b, cands in covers[n]:
            if need.member in cands:
                pieces.append(Piece(t, need.member, need.role, a, b, need.member))
            elif not cands:
                lost.append(Lost(t, a, b))
            elif len(cands) == 1:
                pieces.append(Piece(t, need.member, need.role, a, b, cands[0]))
                load[cands[0]] += (b - a) * rb
            elif b - a > 1 and (b - a) * rb >= 2 * split_bytes:
                split.append(((b - a) * rb, t, need, a, b, cands))
            else:
                pending.append(((b - a) * rb, t, need, a, b, cands))
    for size, t, need, a, b, cands in split:
        k = min(len(cands), b - a)
        bounds = [a + j * (b - a) // k for j in range(k + 1)]
        parts = sorted(itertools.pairwise(bounds), key=lambda xy: (xy[0] - xy[1], xy[0]))
        lightest = sorted(cands, key=lambda c: (load[c], c))  # the larger parts to the least loaded
        for (x, y), who in zip(parts, lightest, strict=False):
            pieces.append(Piece(t, need.member, need.role, x, y, who))
            load[who] += (y - x) * (size // (b - a))
    for size, t, need, a, b, cands in sorted(pending, key=lambda p: (-p[0], p[1], p[2], p[3])):
        who = min(cands, key=lambda c: (load[c], c))
        pieces.append(Piece(t, need.member, need.role, a, b, who))
        load[who] += size
    merged = _merge_lost(lost)
    total = sum(load.values())
    if merged:
        first = merged[0]
        reason = (
            f"{len(merged)} row ranges have no live holder (first: tensor {first.tensor} rows {first.lo}-{first.hi})"
        )
    else:
        senders = sum(1 for v in load.values() if v)
        receivers = len({p.dst for p in pieces if not p.local})
        reason = f"{total} bytes from {senders} holders to {receivers} members"
    return ReshardPlan(tuple(sorted(pieces)), tuple(merged), tuple(sorted(load.items())), reason)


def _cover(n: int, held: list[Holding], wanted: list[Need]) -> list[tuple[Need, int, int, tuple[str, ...]]]:
    """For an n-row tensor: each need's rows cut where some holding starts or ends, with the holders of each
    segment (need order, then row order)."""
    spans = [(h.holder, *shard_rows(n, h.world, h.index)) for h in held]
    cuts = {x for _, lo, hi in spans for x in (lo, hi)}
    out = []
    for need in wanted:
        lo, hi = shard_rows(n, need.world, need.index)
        for a, b in _segments(lo, hi, cuts):
            out.append((need, a, b, tuple(sorted({who for who, x, y in spans if x <= a and b <= y}))))
    return out


def _merge_lost(lost: list[Lost]) -> list[Lost]:
    out: list[Lost] = []
    for item in sorted(set(lost), key=lambda x: (x.tensor, x.lo, x.hi)):
        if out and out[-1].tensor == item.tensor and out[-1].hi >= item.lo:
            last = out[-1]
            out[-1] = Lost(last.tensor, last.lo, max(last.hi, item.hi))
        else:
            out.append(item)
    return out


__all__ = [
    "Holding",
    "Lost",
    "Need",
    "Piece",
    "ReshardPlan",
    "mirrors",
    "plan_reshard",
    "shard_rows",
]
