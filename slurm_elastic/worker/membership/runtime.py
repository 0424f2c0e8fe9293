"""A worker's membership in the job: its control connection, and each generation's store and process group.

`recover` leaves the current generation and keeps joining announced ones until one is formed and every
member holds the same committed state (taken from peers when behind: never from disk). An announcement
that ends the worker (Leave, Stop, a lost coordinator) surfaces as `WorkerEnded`, which the training loop
turns into its one exit path.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from pydantic import BaseModel

from slurm_elastic.decide import worker as decide
from slurm_elastic.errors import ElasticError, StateLost
from slurm_elastic.logs import get_logger
from slurm_elastic.wire.messages import Assign, CollectiveFault, Leave, Phase, Stop, WorkerEvent, WorkerSettings
from slurm_elastic.wire.messages import StateLost as StateLostMessage
from slurm_elastic.worker.env import WorkerEnv
from slurm_elastic.worker.membership.comm import CollectiveFailed, Group, Interrupt, Interrupted, pick_backend
from slurm_elastic.worker.membership.control import ControlFailed, CoordinatorLost, Identity, JobOver
from slurm_elastic.worker.membership.torchworld import DefaultGroup
from slurm_elastic.worker.phases import PhaseHooks
from slurm_elastic.worker.ports import Control, Ports
from slurm_elastic.worker.strategy import Held, Strategy, SyncResult

log = get_logger("slurm_elastic.worker")

# How long a worker whose collective failed waits for the coordinator's new generation before asking
# for one itself (the usual path, a lost peer, brings the generation in milliseconds).
FAULT_GRACE_S = 1.0


class WorkerEnded(Exception):
    """The coordinator (or its absence) ended this worker; `ending` says how."""

    def __init__(self, ending: decide.Ending) -> None:
        super().__init__(ending.reason)
        self.ending = ending


@dataclass(frozen=True)
class Entered:
    """A generation formed and in sync."""

    announcement: Assign
    sync: SyncResult
    form_s: float
    total_s: float


class Runtime:
    def __init__(
        self, env: WorkerEnv, ports: Ports, phases: PhaseHooks, interrupt: Interrupt, device: torch.device
    ) -> None:
        self.env = env
        self.device = device  # the model's: it picks the process groups' backend
        self.ports = ports
        self.phases = phases
        self.interrupt = interrupt
        self.control: Control | None = None
        self.settings: WorkerSettings | None = None
        self.group: Group | None = None
        self.store: Any = None
        self.generation, self.rank, self.world = 0, 0, 1
        self.checkpoints = False  # whether this worker writes disaster-recovery checkpoints
        self.every_rank_saves = False  # whether every rank writes its part of them (a sharded job)
        self._backend = "gloo"
        self.torch_world = DefaultGroup() if ports.process_hooks else None  # ranks as threads share torch's

    # --- life cycle -----------------------------------------------------------------------------------

    def register(self, committed_step: int) -> WorkerSettings:
        env = self.env
        identity = Identity(env.job_id, env.worker_id, env.node, env.local_rank)
        address = env.control or env.coordinator or ""  # the node's relay where the agent runs one
        self.control = self.ports.control(address, env.secret, identity, self.interrupt)
        try:
            self.settings = self.control.register(committed_step, os.getpid())
        except JobOver as exc:
            raise WorkerEnded(decide.ending_for_refused_registration(str(exc))) from None
        self._backend = pick_backend(self.settings.backend, self.device)
        return self.settings

    def solo(self) -> Group:
        """No coordinator: this process is the whole job."""
        self.group = Group(None, 0, 1, 1, self.interrupt)
        self.generation, self.rank, self.world = 1, 0, 1
        if self.torch_world is not None:
            self.torch_world.install(None, 0, 1, self.device.type, None)
        return self.group

    def close(self) -> None:
        self._close_store()
        if self.control is not None:
            self.control.close()
            self.control = None

    def _close_store(self) -> None:
        """The store client of a generation that is over: a call it left blocked fails now."""
        close = getattr(self.store, "close", None)
        self.store = None
        if close is not None:
            close()

    # --- what the training loop asks -------------------------------------------------------------------

    @property
    def standalone(self) -> bool:
        return self.control is None

    def superseded(self) -> bool:
        return self.interrupt.is_set()

    def change_requested(self) -> bool:
        return self.control is not None and self.control.change_requested()

    def set_phase(self, step: int, phase: Phase) -> None:
        if self.control is not None:
            self.control.progress = (self.generation, step, phase)

    def send(self, message: BaseModel) -> None:
        if self.control is not None:
            self.control.send(message)

    def report(self, kind: str, fields: dict[str, Any]) -> None:
        """One structured event about this worker, through the coordinator (and this process's log)."""
        log.warning(kind, worker=self.env.worker_id, **fields)
        self.send(WorkerEvent(kind=kind, fields=fields))  # the coordinator adds the worker's id

    # --- generations ----------------------------------------------------------------------------------

    def abandon(self) -> None:
        if self.torch_world is not None:
            self.torch_world.remove()  # first: torch's default group never points at an abandoned one
        if self.group is not None:
            self.group.abandon()
            self.group = None
        self._close_store()

    def recover(self, strategy: Strategy, *, patient: bool, keep_group: bool = False) -> Entered:
        """Leave the current generation; join announced ones until one is formed and in sync. `keep_group`:
        the group is sound (a step boundary, the loop's end): keep it until an announcement comes, so that a
        job that completes there leaves the script a working group for its code after the loop."""
        if not keep_group:
            self.abandon()
        held = strategy.held
        while True:
            announcement = self._next_announcement(patient, held)
            self.abandon()
            patient = False
            try:
                return self._enter(announcement, strategy)
            except (Interrupted, CollectiveFailed) as exc:
                log.info("generation_attempt_failed", generation=self.generation, reason=str(exc))
                self.abandon()
            except StateLost as exc:
                # The coordinator restarts every worker from the checkpoint (or stops the job): wait for it.
                log.error("training_state_lost", generation=self.generation, reason=str(exc))
                step = max(held.step, 0)
                self.send(StateLostMessage(generation=max(self.generation, 1), step=step, detail=str(exc)[:2000]))
                self.abandon()
                patient = True

    def _next_announcement(self, patient: bool, replica: Held) -> Assign:
        control = self.control
        if control is None:  # closed: the loop finished or the worker left; nothing may join a generation now
            raise ElasticError("the worker's control connection is closed: it finished its loop or left the job")
        try:
            ann = control.next_announcement(self.generation, None if patient else FAULT_GRACE_S)
            if ann is None:
                detail = "no new generation after a fault"
                control.send(CollectiveFault(generation=max(self.generation, 1), step=replica.step, detail=detail))
                ann = control.next_announcement(self.generation)
        except CoordinatorLost as exc:
            raise WorkerEnded(decide.ending_for_lost_coordinator(str(exc))) from None
        except ControlFailed as exc:
            raise WorkerEnded(decide.ending_for_failed_control(str(exc))) from None
        if isinstance(ann, Leave):
            raise WorkerEnded(decide.ending_for_leave(ann.reason))
        if isinstance(ann, Stop) and ann.reason == "complete" and ann.error is None and not replica.fresh:
            self.interrupt.clear()  # (a Stop sets it): the group stays the script's after its loop
            raise WorkerEnded(decide.ending_for_complete(f"training ended at step {replica.step}"))
        if isinstance(ann, Stop):
            holds = not replica.fresh
            ending = decide.ending_for_stop(
                ann.reason,
                ann.error,
                rank=self.rank,
                holds_state=holds,
                checkpoints=self.checkpoints,
                sharded=self.every_rank_saves,
            )
            raise WorkerEnded(ending)
        assert isinstance(ann, Assign)
        return ann

    def _enter(self, ann: Assign, strategy: Strategy) -> Entered:
        control, settings = self.control, self.settings
        assert control is not None and settings is not None
        started = time.monotonic()
        control.enter_generation(ann.generation)
        self.generation, self.rank, self.world = ann.generation, ann.rank, len(ann.ranks)
        step = strategy.held.step
        self.set_phase(step, "recovery")
        # A fresh store connection per generation: closing the last one (in `abandon`) fails any call an
        # abandoned rendezvous left blocked, so no helper thread waits on it for the group timeout.
        env = self.env
        try:
            address = env.store or env.coordinator or ""  # the node's relay where the agent runs one
            self.store = self.ports.store(address, env.secret, env.job_id, settings.pg_timeout_s)
        except (OSError, RuntimeError, ElasticError) as exc:  # torch's DistStoreError is a RuntimeError
            raise CollectiveFailed(f"rendezvous store of generation {ann.generation}: {exc}") from exc
        self.group = self.ports.groups(
            self.store,
            settings.store_prefix,
            ann.rank,
            len(ann.ranks),
            ann.generation,
            backend=self._backend,
            timeout_s=settings.pg_timeout_s,
            interrupt=self.interrupt,
        )
        if self.torch_world is not None:
            scope = f"{settings.store_prefix}/g{ann.generation}/torch"  # dropped with the generation's keys
            user_store = dist.PrefixStore(scope, self.store) if isinstance(self.store, dist.Store) else None
            self.torch_world.install(self.group.pg, ann.rank, len(ann.ranks), self.device.type, user_store)
        formed = time.monotonic()
        self.phases.fire("recovery", step + 1)
        transfer = lambda: self.phases.fire("transfer", step + 1)  # noqa: E731
        result = strategy.heal(self.group, self.store, settings.store_prefix, list(ann.ranks), transfer)
        return Entered(ann, result, formed - started, time.monotonic() - started)

    def report_generation(self, entered: Entered, extra: dict[str, Any]) -> None:
        """Rank 0 tells the coordinator how the generation formed (one `generation_ready` event)."""
        if self.rank != 0:
            return
        sync = entered.sync
        fields = {
            "generation": self.generation,
            "cause": entered.announcement.cause,
            "world": self.world,
            "form_s": round(entered.form_s, 4),
            "sync_s": round(sync.seconds, 4),
            "total_s": round(entered.total_s, 4),
            "resume_step": sync.target_step,
            "receivers": list(sync.receivers),
            "sources": list(sync.sources),
            "bytes": sync.bytes_moved,
            "transfer": sync.reason,
            **extra,
        }
        self.send(WorkerEvent(kind="generation_ready", fields=fields))
