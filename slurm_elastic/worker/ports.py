"""The seams of a worker: what its runtime receives instead of building it, so tests can run ranks as
threads with a group that fails a chosen collective, or a fault plan, without touching the training loop.

The defaults are the real things: a control connection to the coordinator, a client of the coordinator's
rendezvous store (authenticated with the job's secret), a gloo or NCCL process group, the fault plan from
the environment, and the process hooks (SIGTERM becomes a drain, an uncaught exception is reported).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from slurm_elastic.wire.messages import Phase, WorkerSettings
from slurm_elastic.worker.membership.comm import Group, Interrupt
from slurm_elastic.worker.membership.control import Announcement, ControlClient, Identity
from slurm_elastic.worker.phases import PhaseHooks


class Control(Protocol):
    """The worker's connection to its coordinator (ControlClient)."""

    progress: tuple[int, int, Phase]

    def register(self, committed_step: int, pid: int) -> WorkerSettings: ...

    def next_announcement(self, after: int, timeout: float | None = None) -> Announcement | None: ...

    def enter_generation(self, generation: int) -> None: ...

    def change_requested(self) -> bool: ...

    def send(self, msg: BaseModel) -> None: ...

    def close(self) -> None: ...


# Attaches a test's or chaos's actions to the job's phase hooks, given what the rank holds (its replica or
# shard holder): e.g. testing.injector.FaultInjector(...).attach.
ArmFaults = Callable[[PhaseHooks, Any], None]


ControlFactory = Callable[[str, str, Identity, Interrupt], Control]
StoreFactory = Callable[
    [str, str, str, float], Any
]  # (the store's address: the node's relay or the coordinator, secret, job id, timeout_s) -> a Store
GroupFactory = Callable[..., Group]  # Group.form's signature


def coordinator_store(address: str, secret: str, job_id: str, timeout_s: float) -> Any:
    from slurm_elastic.rendezvous.client import CoordinatorStore

    return CoordinatorStore(address, secret, job_id, timeout_s)


@dataclass(frozen=True)
class Ports:
    control: ControlFactory = ControlClient
    store: StoreFactory = coordinator_store
    groups: GroupFactory = Group.form
    faults: ArmFaults | None = None  # None: the plan in the worker's environment, if it names this worker
    process_hooks: bool = True  # off for ranks that are threads of one process
