"""Whether the coordinator's side of a split may go on (pure).

A node gone silent is evicted and the job goes on without it. But silence cannot tell a dead node from a
cut link, and a cut can isolate the batch host (where the coordinator runs) from every other node: the
others then find the coordinator silent and requeue the job, and if the coordinator's side also went on,
two sides would train and write. So when silence takes half of the job's nodes or more within one lease
(the nodes of one cut fall silent within a heartbeat of each other), the coordinator's side is the
smaller part of a split, or cannot tell: it stops without writing anything, and the job is requeued to
resume from its latest checkpoint on whichever side Slurm still reaches.

The nodes of one cut do not reach their leases in the same scan (their last heartbeats differ by up to an
interval), nor do a node's workers and its agent. So a node near its lease ("quiet") is judged with the
silent: while the silent and the quiet together are half the nodes or more, nothing is evicted until the
quiet either speak or fall silent too. Evicting the first of them would form a generation on the wrong
side of the cut.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["SilenceWindow", "lost", "observe", "verdict"]

Verdict = Literal["go", "wait", "stop"]


@dataclass(frozen=True)
class SilenceWindow:
    opened: float  # when its first node fell silent (monotonic)
    nodes: frozenset[str]  # the job's nodes then
    silent: frozenset[str] = frozenset()  # those silent since


def observe(
    window: SilenceWindow | None, now: float, nodes: Set[str], silent: Set[str], span_s: float
) -> SilenceWindow | None:
    """The window after this scan found `silent` among `nodes` (the nodes whose agents are connected)."""
    if window is not None and now - window.opened > span_s:
        window = None  # its silences were separate losses, each judged then
    if not silent:
        return window
    if window is None:
        window = SilenceWindow(now, frozenset(nodes) | frozenset(silent))
    return replace(window, silent=window.silent | frozenset(silent))


def lost(window: SilenceWindow | None) -> bool:
    """Half the nodes or more fell silent within the window: no majority is left on this side."""
    if window is None or len(window.nodes) < 2:
        return False
    return 2 * len(window.nodes - window.silent) <= len(window.nodes)


def verdict(window: SilenceWindow | None, nodes: Set[str], quiet: Set[str]) -> Verdict:
    """What this side does after a scan: "stop" (no majority), "wait" (the silent and the `quiet`, nodes
    near their lease, are half of `nodes` or more: judge them together once the quiet are heard or silent)
    or "go" (evict the silent; the quiet nodes' workers wait for their agents' verdict)."""
    if lost(window):
        return "stop"
    silent = window.silent if window is not None else frozenset()
    everyone = frozenset(nodes) | (window.nodes if window is not None else frozenset())
    at_risk = silent | (frozenset(quiet) & everyone)
    if quiet and len(everyone) >= 2 and 2 * len(everyone - at_risk) <= len(everyone):
        return "wait"
    return "go"
