"""Every member runs the same training loop: where each loop ends and with which batches must agree, or
ranks would wait for each other at different places. Pure: the settings a worker's loop runs with, compared
with the first worker's, and the step a member is in by its heartbeat."""

from __future__ import annotations

from collections.abc import Mapping

LoopSettings = Mapping[str, int | float | str | bool | None]

STEPPING = frozenset({"compute", "allreduce", "optimizer", "commit"})

SAME_LOOP = (
    "every rank must ask for the same loop (to train n more steps after a resume, derive the total from a "
    "value every rank shares, such as the resumed checkpoint's step, not from job.step on a rank that joined later)"
)


def loop_difference(first_worker: str, first: LoopSettings, worker: str, settings: LoopSettings) -> str | None:
    """One line naming each setting where `worker`'s loop differs from `first_worker`'s, or None."""
    differ = [k for k in sorted(set(first) | set(settings)) if first.get(k) != settings.get(k)]
    if not differ:
        return None
    sides = "; ".join(
        f"{k} {_show(first.get(k))} on {first_worker}, {_show(settings.get(k))} on {worker}" for k in differ
    )
    return f"the workers' training loops differ: {sides}; {SAME_LOOP}"


def _show(value: object) -> str:
    return "(none)" if value is None else repr(value) if isinstance(value, str) else str(value)


def step_running(committed: int, phase: str) -> int:
    """The step a member is in by its heartbeat: the phases of a step report the step committed before it."""
    return committed + 1 if phase in STEPPING else committed
