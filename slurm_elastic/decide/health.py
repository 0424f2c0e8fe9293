"""Which members are dead or hung, judged from heartbeats and progress marks.

- Silent: nothing heard for `lease_timeout_s` (a stopped process, a lost node without a TCP reset).
- Hung: its progress mark (step, phase) has not moved for `hang_timeout_s` while it computes and a peer
  already waits in the reduction of the same step, i.e. the others are blocked on it. When everyone waits
  in a collective nobody is singled out: the collective's own timeout handles that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Liveness:
    worker_id: str
    last_seen: float
    step: int
    phase: str
    phase_since: float


@dataclass(frozen=True)
class Verdict:
    worker_id: str
    cause: str  # "lease" | "hang"
    reason: str


def find_unresponsive(
    now: float, members: Sequence[Liveness], *, lease_timeout_s: float, hang_timeout_s: float
) -> tuple[Verdict, ...]:
    verdicts: list[Verdict] = []
    waiting_steps = {m.step for m in members if m.phase == "allreduce"}
    for m in members:
        silent = now - m.last_seen
        if silent > lease_timeout_s:
            verdicts.append(Verdict(m.worker_id, "lease", f"no heartbeat for {silent:.1f} s"))
            continue
        stuck = now - m.phase_since
        if m.phase == "compute" and stuck > hang_timeout_s and m.step in waiting_steps:
            verdicts.append(
                Verdict(m.worker_id, "hang", f"no progress for {stuck:.1f} s in step {m.step + 1} while peers wait")
            )
    return tuple(verdicts)


def stalled_for(previous: float, now: float, interval_s: float, *, slack: float = 5.0, busy_s: float = 0.0) -> float:
    """How long a loop that should run every `interval_s` was itself stopped (SIGSTOP, `scontrol suspend`,
    a frozen VM) between `previous` and `now`: 0 for an ordinary delay. Silence of the others during that
    time says nothing about them, so their leases are extended by it.

    `busy_s`, where known, is the CPU time the loop's own thread spent in that gap: a loop that ran for half
    of it or more was slow (a burst of work), not stopped, and the others' silence in it was real. Counting
    its every slow turn as a stop would push a silent peer's eviction back without end under load."""
    gap = now - previous
    if gap <= max(slack * interval_s, 1.0) or busy_s >= gap / 2:
        return 0.0
    return gap - interval_s
