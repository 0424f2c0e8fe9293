"""Decisions of the launcher inside a Slurm allocation: which Slurm node states become drains, how many
satellite jobs to submit so that `keep_pending` of them wait in the queue, and which nodes that came back
get a new agent."""

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


@dataclass(frozen=True)
class AgentSteps:
    starting: set[str]  # a new agent's srun is alive and no agent of it has registered yet
    stale: set[str]  # its agent registered and is gone, but its srun lives on: end it, it blocks the next


def agent_steps(alive: set[str], registered: set[str], have_agent: set[str]) -> AgentSteps:
    """Sort the nodes whose relaunched agent's srun is `alive`. `registered`: nodes where an agent registered
    since that srun started. When the node dies under it, srun waits for tasks that no longer exist, until
    Slurm ends the step (SlurmdTimeout, or never if the node comes back first); it must not count as a new
    agent still starting, or the node never gets one again."""
    return AgentSteps(starting=alive - registered, stale=(alive & registered) - have_agent)


@dataclass(frozen=True)
class Relaunches:
    start: list[str]  # start a new agent there now
    give_up: list[str]  # `max_tries` new agents in a row never came back: no more (reported once)


def relaunches(
    allocation: Iterable[NodeInfo],
    *,
    had_agent: set[str],
    have_agent: set[str],
    excluded: set[str],
    starting: set[str],
    tries: Mapping[str, tuple[int, float]],
    now: float,
    retry_s: float,
    max_tries: int,
) -> Relaunches:
    """Nodes of the job's own allocation whose agent was lost and that Slurm shows healthy again (e.g. a
    node whose slurmd came back) get a new agent, at most every `retry_s`. `excluded`: drained on purpose or
    given up; `starting`: a new agent still starting there; `tries`: per node, new agents started in a row
    without one registering, and when the last was. A node that would need more than `max_tries` is given up,
    as a node whose workers keep crashing is: without a bound, a node where no agent can start is retried
    for as long as the job runs."""
    start: list[str] = []
    give_up: list[str] = []
    for node in allocation:
        name = node.name
        if name in have_agent or name not in had_agent or name in excluded or name in starting:
            continue
        if _failed(node) or node.drain:
            continue
        count, last = tries.get(name, (0, now - retry_s))
        if now - last < retry_s:
            continue
        (start if count < max_tries else give_up).append(name)
    return Relaunches(start, give_up)
