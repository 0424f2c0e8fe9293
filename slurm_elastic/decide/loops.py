"""Every member runs the same training loop: where each loop ends and with which batches must agree, or
ranks would wait for each other at different places. Pure: the settings a worker's loop runs with, compared
with the first worker's, and the latest step a member's heartbeat proves it took."""

from __future__ import annotations

from collections.abc import Mapping

LoopSettings = Mapping[str, int | float | str | bool | None]

# A step's phases after its last backward. Its compute phase begins when its first micro-batch is handed
# out, and a loop may still leave there, at the boundary before that step.
TAKEN = frozenset({"allreduce", "optimizer", "commit"})

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


def step_taken(committed: int, phase: str) -> int:
    """The latest step a member's heartbeat proves it took: a step's phases report the step committed before
    it, and only those after its last backward show that its loop went on into it."""
    return committed + 1 if phase in TAKEN else committed
