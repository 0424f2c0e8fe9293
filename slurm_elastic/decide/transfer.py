"""Who sends the training state to whom when a generation forms.

Every member reports its last committed step and a fingerprint of its parameters. The target is the
newest step any healthy member committed (a survivor that finished the step in flight is ahead of one that
did not; both are valid, because a completed reduction already contained every contribution). Members at
the target whose fingerprints agree with the majority are sources; everyone else (joiners, laggards, and
replicas whose state disagrees or holds NaN) receives. The state is cut into chunks and each receiver
takes different chunks from different sources, so several joiners spread their load over all sources.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class PeerState:
    rank: int
    committed_step: int  # -1: fresh, holds no committed state
    fingerprint: tuple[float, ...]


@dataclass(frozen=True)
class Send:
    chunk: int
    src: int
    dst: int


@dataclass(frozen=True)
class RecoveryPlan:
    target_step: int
    sources: tuple[int, ...]
    receivers: tuple[int, ...]
    n_chunks: int
    sends: tuple[Send, ...]
    reason: str

    def sends_from(self, rank: int) -> tuple[Send, ...]:
        return tuple(s for s in self.sends if s.src == rank)

    def sends_to(self, rank: int) -> tuple[Send, ...]:
        return tuple(s for s in self.sends if s.dst == rank)


def _healthy(peer: PeerState) -> bool:
    return peer.committed_step >= 0 and all(math.isfinite(x) for x in peer.fingerprint)


def plan_recovery(peers: list[PeerState], max_chunks: int = 8) -> RecoveryPlan:
    if not peers:
        raise ValueError("plan_recovery needs at least one peer")
    ranks = sorted(p.rank for p in peers)
    healthy = [p for p in peers if _healthy(p)]
    if not healthy:
        if any(p.committed_step >= 0 for p in peers):
            # Every replica holding committed state is corrupt: nobody may serve as a source.
            return RecoveryPlan(-1, (), tuple(ranks), 0, (), "no healthy replica: every committed state is non-finite")
        src = ranks[0]
        return _with_sends(0, (src,), tuple(r for r in ranks if r != src), max_chunks, f"fresh start: rank {src}'s")
    target = max(p.committed_step for p in healthy)
    at_target = [p for p in healthy if p.committed_step == target]
    votes = Counter(p.fingerprint for p in at_target)
    best = max(votes.values())
    lowest_of = {fp: min(p.rank for p in at_target if p.fingerprint == fp) for fp in votes}
    winner = min((fp for fp, n in votes.items() if n == best), key=lambda fp: lowest_of[fp])
    sources = tuple(sorted(p.rank for p in at_target if p.fingerprint == winner))
    receivers = tuple(r for r in ranks if r not in sources)
    dissent = len(at_target) - len(sources)
    note = f" ({dissent} replicas at step {target} disagree)" if dissent else ""
    return _with_sends(target, sources, receivers, max_chunks, f"step {target}{note}: ranks {list(sources)}'")


def _with_sends(
    target: int, sources: tuple[int, ...], receivers: tuple[int, ...], max_chunks: int, who: str
) -> RecoveryPlan:
    if not receivers:
        return RecoveryPlan(target, sources, (), 0, (), f"{who} state is already everywhere")
    n_chunks = max(1, min(len(sources), max_chunks))
    sends = tuple(
        Send(chunk, sources[(j * n_chunks + chunk) % len(sources)], dst)
        for j, dst in enumerate(receivers)
        for chunk in range(n_chunks)
    )
    reason = f"{who} state to ranks {list(receivers)} in {n_chunks} chunks from {len(sources)} sources"
    return RecoveryPlan(target, sources, receivers, n_chunks, sends, reason)


def chunk_bounds(total: int, n_chunks: int, chunk: int) -> tuple[int, int]:
    """Byte range [start, end) of `chunk` when `total` bytes are cut into `n_chunks` near-equal pieces."""
    return chunk * total // n_chunks, (chunk + 1) * total // n_chunks
