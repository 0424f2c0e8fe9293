"""Whether the coordinator's side of a split may go on (pure).

A node gone silent is evicted and the job goes on without it. But silence cannot tell a dead node from a
cut link, and a cut can isolate the batch host (where the coordinator runs) from every other node: the
others then find the coordinator silent and requeue the job, and if the coordinator's side also went on,
two sides would train and write. So when silence takes half of the job's nodes or more within one lease
(the nodes of one cut fall silent within a heartbeat of each other), the coordinator's side is the
smaller part of a split, or cannot tell: it stops without writing anything, and the job is requeued to
resume from its latest checkpoint on whichever side Slurm still reaches.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, replace

__all__ = ["SilenceWindow", "lost", "observe"]


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
