"""Named points of a worker's step and recovery, where tests and `chaos` act (a fault, a tampered send).

The runtime calls `fire(phase, step)` at each point and `sending(dst, payload)` before each shard it sends
when re-sharding. Nothing is attached unless a test or an armed fault plan attaches it: then a point costs
one dictionary lookup, and no fault code is loaded (slurm_elastic.testing.injector is imported only by a
worker whose SLURM_ELASTIC_FAULTS names it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slurm_elastic.faults import FaultPhase

PhaseHook = Callable[[int], None]  # called with the step being run
SendHook = Callable[[int, Any], None]  # (destination rank, the payload about to go): may alter it in place


class PhaseHooks:
    def __init__(self) -> None:
        self._at: dict[str, list[PhaseHook]] = {}
        self._sends: list[SendHook] = []

    def on(self, phase: FaultPhase, hook: PhaseHook) -> None:
        self._at.setdefault(phase, []).append(hook)

    def on_send(self, hook: SendHook) -> None:
        self._sends.append(hook)

    def attached(self, phase: FaultPhase) -> bool:
        return phase in self._at

    def fire(self, phase: FaultPhase, step: int) -> None:
        for hook in self._at.get(phase, ()):
            hook(step)

    def sending(self) -> SendHook | None:
        """What to call before each send when re-sharding; None when nothing is attached (the common case)."""
        if not self._sends:
            return None

        def send(dst: int, payload: Any) -> None:
            for hook in self._sends:
                hook(dst, payload)

        return send
