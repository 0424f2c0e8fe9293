"""Worker side of a fault plan (slurm_elastic.faults): fires this worker's faults at their step and phase,
through the runtime's phase hooks (worker.phases). A worker imports this module only when its environment's
SLURM_ELASTIC_FAULTS names it, so a job without faults runs none of this code.
"""

from __future__ import annotations

import functools
import os
import signal
from typing import TYPE_CHECKING

import torch

from slurm_elastic.faults import Fault, FaultPhase, FaultPlan, fired_marker

if TYPE_CHECKING:
    from slurm_elastic.worker.phases import PhaseHooks


class InjectedFault(RuntimeError):
    """The exception a `raise` fault throws, standing in for a bug in user code."""


class FaultInjector:
    """Worker side: fires this worker's faults at their step and phase."""

    def __init__(self, plan: FaultPlan, node: str, local_rank: int, incarnation: int) -> None:
        self._held: object = None  # what this rank holds (a replica, or a sharded holder): a "corrupt" fault's target
        self._fired_dir = plan.fired_dir
        self._pending = [
            (i, f)
            for i, f in enumerate(plan.faults)
            if f.node == node and (f.action == "kill_node" or f.local_rank == local_rank)
            if f.incarnation == incarnation
            if self._fired_dir is None or not fired_marker(self._fired_dir, i).exists()
        ]

    @property
    def armed(self) -> bool:
        return bool(self._pending)

    def attach(self, phases: PhaseHooks, held: object) -> None:
        """Fire at the points of `phases` where this worker has faults, on `held` (what the rank holds)."""
        self._held = held
        for phase in sorted({fault.phase for _, fault in self._pending}):
            phases.on(phase, functools.partial(self.hit, phase))

    def hit(self, phase: FaultPhase, step: int) -> None:
        for i, fault in self._pending:
            if fault.phase == phase and (fault.step == step or (fault.after and step >= fault.step)):
                self._pending.remove((i, fault))
                if self._claim(i):
                    self._fire(fault)
                return

    def _claim(self, index: int) -> bool:
        """Mark fault `index` fired (before it fires: a kill ends this process); False if another process
        of the job already fired it."""
        if self._fired_dir is None:
            return True
        try:
            os.close(os.open(fired_marker(self._fired_dir, index), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return False
        except OSError:
            pass  # no record: fire anyway (the fault is what the plan asked for)
        return True

    def _fire(self, fault: Fault) -> None:
        if fault.action == "corrupt":
            corrupt_own_shard(self._held, fault.step)
        elif fault.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.action == "kill_node":
            os.killpg(os.getpgrp(), signal.SIGKILL)
        elif fault.action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            raise InjectedFault(f"injected fault at step {fault.step}, phase {fault.phase}")


def corrupt_own_shard(held: object, step: int) -> None:
    """Flip the low bit of a few bytes of this rank's own shard (bad memory), through the holder's public
    view of its tensors (`entries`, `own`)."""
    entries, own = getattr(held, "entries", None), getattr(held, "own", None)
    if entries is None or own is None:
        raise InjectedFault(f"corrupt fault at step {step}: this job holds no shard to corrupt")
    for entry in entries():
        rows = own(entry)
        if rows.numel():
            raw = rows.detach().reshape(-1).view(torch.uint8)
            raw[: min(8, raw.numel())] ^= 1
            return
