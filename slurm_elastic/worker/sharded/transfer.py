"""Carry out a re-shard plan over the generation's group: the rows each member needs, from the holders the
plan names, point to point, with a checksum and the step on every range.

Between any two members, all the pieces one sends the other travel as one message pair:

    header  int64 [MAGIC, generation, step, count, crc32 of piece 0, ..., crc32 of piece count-1]
    payload uint8 the pieces' bytes back to back, in the plan's order

Both ends derive the same plan, so the receiver knows every piece's size and where it goes. It refuses the
whole message when the magic, the generation or the step is not what the plan says, or when any piece's
bytes do not match its checksum; the refusals of every member are then shared (one allgather), and the
caller plans again without the refused senders' copies. Tensors only, never pickle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from slurm_elastic.decide.reshard import Piece, ReshardPlan, shard_rows
from slurm_elastic.worker.membership.comm import Group
from slurm_elastic.worker.sharded.checksum import crc32
from slurm_elastic.worker.sharded.remesh import Entry

MAGIC = 0x53455244  # "SERD"
HEADER = 4

Copies = dict[str, tuple[int, int, dict[int, torch.Tensor]]]  # role -> (world, shard index, rows per entry)
Tamper = Callable[[int, torch.Tensor], None]  # tests: (destination rank, payload) after the checksums are taken


@dataclass(frozen=True)
class Received:
    rows: dict[tuple[str, int], torch.Tensor]  # (role, entry index) -> this member's new rows
    refused_from: frozenset[int]  # senders whose data any member refused this round


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _source_rows(copies: Copies, entry: Entry, t: int, lo: int, hi: int) -> torch.Tensor:
    for world, index, rows in copies.values():
        x, y = shard_rows(entry.rows, world, index)
        if x <= lo and hi <= y:
            return rows[t][lo - x : hi - x]
    raise ValueError(f"rows {lo}-{hi} of {entry.fqn}.{entry.key}: this member holds no copy of them")


def execute(
    group: Group,
    plan: ReshardPlan,
    entries: list[Entry],
    copies: Copies,
    needs: dict[str, tuple[int, int]],
    step: int,
    *,
    round_: int = 0,
    tamper: Tamper | None = None,
) -> Received:
    """This member's part of `plan`: send what it serves, receive and check what it needs (role -> layout)."""
    me = str(group.rank)
    rows: dict[tuple[str, int], torch.Tensor] = {}
    for role, (world, index) in needs.items():
        for t, e in enumerate(entries):
            lo, hi = shard_rows(e.rows, world, index)
            rows[(role, t)] = torch.empty((hi - lo, *e.shape[1:]), dtype=e.dtype)
    outgoing: dict[int, list[Piece]] = defaultdict(list)
    incoming: dict[int, list[Piece]] = defaultdict(list)
    for p in plan.pieces:
        if p.local and p.dst == me:
            lo = shard_rows(entries[p.tensor].rows, *needs[p.role])[0]
            rows[(p.role, p.tensor)][p.lo - lo : p.hi - lo].copy_(
                _source_rows(copies, entries[p.tensor], p.tensor, p.lo, p.hi)
            )
        elif p.src == me and not p.local:
            outgoing[int(p.dst)].append(p)
        elif p.dst == me and not p.local:
            incoming[int(p.src)].append(p)
    tag = 16 + 2 * round_
    sends: list[tuple[torch.Tensor, int, int]] = []
    for dst, pieces in sorted(outgoing.items()):
        parts = [_as_bytes(_source_rows(copies, entries[p.tensor], p.tensor, p.lo, p.hi)) for p in pieces]
        header = torch.tensor(
            [MAGIC, group.generation, step, len(parts), *(crc32(x) for x in parts)], dtype=torch.int64
        )
        payload = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
        if tamper is not None:
            tamper(dst, payload)
        sends.append((header, dst, tag))
        if payload.numel():
            sends.append((payload, dst, tag + 1))
    recvs: list[tuple[torch.Tensor, int, int]] = []
    expected: dict[int, tuple[torch.Tensor, torch.Tensor, list[int]]] = {}
    for src, pieces in sorted(incoming.items()):
        sizes = [(p.hi - p.lo) * entries[p.tensor].row_bytes for p in pieces]
        header = torch.empty(HEADER + len(pieces), dtype=torch.int64)
        payload = torch.empty(sum(sizes), dtype=torch.uint8)
        recvs.append((header, src, tag))
        if payload.numel():
            recvs.append((payload, src, tag + 1))
        expected[src] = (header, payload, sizes)
    if sends or recvs:
        group.exchange(sends, recvs)
    refused: set[int] = set()
    for src, (header, payload, sizes) in expected.items():
        pieces = incoming[src]
        fields = header.tolist()
        if fields[:HEADER] != [MAGIC, group.generation, step, len(pieces)]:
            refused.add(src)
            continue
        offsets = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        chunks = [payload[offsets[i] : offsets[i + 1]] for i in range(len(pieces))]
        if any(crc32(c) != crc for c, crc in zip(chunks, fields[HEADER:], strict=True)):
            refused.add(src)
            continue
        for p, chunk in zip(pieces, chunks, strict=True):
            e = entries[p.tensor]
            lo = shard_rows(e.rows, *needs[p.role])[0]
            rows[(p.role, p.tensor)][p.lo - lo : p.hi - lo].view(-1).view(torch.uint8).copy_(chunk)
    flags = torch.zeros(group.world, dtype=torch.float64)
    for src in refused:
        flags[src] = 1.0
    if group.world > 1:
        group.allreduce_(flags)
    everyone = frozenset(int(r) for r in torch.nonzero(flags).flatten().tolist())
    return Received(rows, everyone)


__all__ = ["MAGIC", "Received", "execute"]
