"""Decisions of the launcher inside a Slurm allocation: which Slurm node states become drains, and how
many satellite jobs to submit so that `keep_pending` of them wait in the queue."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from slurm_elastic.slurm import NodeInfo


@dataclass(frozen=True)
class NodeDrain:
    node: str
    mode: Literal["boundary", "now"]
    reason: str


def _failed(node: NodeInfo) -> bool:
    return node.down or "FAIL" in node.flags or node.state == "FAIL"


def drains_for(nodes: Iterable[NodeInfo], members: set[str], notified: set[str]) -> list[NodeDrain]:
    """FAIL or DOWN: leave now; DRAIN: leave at the next step boundary. Each node once (per `notified`)."""
    out = []
    for node in nodes:
        if node.name not in members or node.name in notified:
            continue
        why = f"Slurm marks {node.name} {node.state}" + (f" ({node.reason})" if node.reason else "")
        if _failed(node):
            out.append(NodeDrain(node.name, "now", why))
        elif node.drain:
            out.append(NodeDrain(node.name, "boundary", why))
    return out


def back_in_service(nodes: Iterable[NodeInfo], notified: set[str]) -> set[str]:
    """Nodes once turned into drains that Slurm shows healthy again (an admin resumed them): forgotten, so
    that their next DRAIN or DOWN, e.g. under a satellite that landed there since, counts anew."""
    return {n.name for n in nodes if n.name in notified and not (_failed(n) or n.drain)}


def satellites_to_submit(pending: int, keep_pending: int, limit: int = 64) -> int:
    return max(0, min(keep_pending - pending, limit))


def nodes_to_relaunch(
    allocation: Iterable[NodeInfo],
    *,
    had_agent: set[str],
    have_agent: set[str],
    drained: set[str],
    last_try: Mapping[str, float],
    now: float,
    retry_s: float,
) -> list[str]:
    """Nodes of the job's own allocation whose agent was lost (not drained on purpose) and that Slurm shows
    healthy again, e.g. a node whose slurmd came back: start a new agent there, at most every `retry_s`."""
    out = []
    for node in allocation:
        name = node.name
        if name in have_agent or name not in had_agent or name in drained:
            continue
        if node.down or node.drain or "FAIL" in node.flags or node.state == "FAIL":
            continue
        if now - last_try.get(name, -retry_s) >= retry_s:
            out.append(name)
    return out
