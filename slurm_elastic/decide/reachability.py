"""Which nodes to evict when some of them cannot reach each other (pure).

A cut between two nodes that both still reach the coordinator (a one-way route, a dead fabric port) stops
no heartbeat: only their collective notices, at its timeout. The coordinator then has every member node
try to connect to every other (`slurm_elastic.probe`); what failed comes here as directed pairs
(from, to). The rest of the job must be able to form a full mesh, so at least one node of each failing
pair goes: the fewest nodes that cover every pair, found greedily (the node in most failing pairs first).
Between equals the node with the later ranks goes, so rank 0's node (the batch host, where the
coordinator runs) stays while it can.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

__all__ = ["cleared", "to_evict"]


def to_evict(failing: Iterable[tuple[str, str]], order: Sequence[str]) -> tuple[str, ...]:
    """The nodes to evict so that no failing pair remains among the rest. `order`: the member nodes by
    their first rank; a node it lacks counts as the last."""
    edges = {frozenset(pair) for pair in failing if pair[0] != pair[1]}
    place = {node: i for i, node in enumerate(order)}
    evicted: list[str] = []
    while edges:
        degree = Counter(node for edge in edges for node in edge)
        node = max(degree, key=lambda n: (degree[n], place.get(n, len(place)), n))
        evicted.append(node)
        edges = {edge for edge in edges if node not in edge}
    return tuple(sorted(evicted))


def cleared(node: str, failing: Iterable[tuple[str, str]]) -> bool:
    """`node` reaches, and is reached by, every node probed with it."""
    return not any(node in pair and pair[0] != pair[1] for pair in failing)
