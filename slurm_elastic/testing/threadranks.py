"""Test doubles shipped with the worker library: ranks as threads of one process, and a process group
that fails a chosen collective. Everything else is real: the coordinator, control connections, stores,
gloo groups, state transfers. Recovery logic is tested in seconds without starting a process.

    job = ThreadJob(train, nodes=3, faults=[GroupFault("t2:0:0", generation=1, nth=4, action="die")])
    results = job.run()

`train(env, ports)` builds a model and an ElasticJob with `env=env, ports=ports`, trains and returns what
the test compares. A rank that "dies" leaves as a SIGKILLed process does: its control connection closes
and its group is abandoned, with nothing said first.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.faults import FaultPlan
from slurm_elastic.testing.injector import FaultInjector
from slurm_elastic.waiting import wait_until
from slurm_elastic.wire.channel import new_secret
from slurm_elastic.worker.env import WorkerEnv
from slurm_elastic.worker.membership.comm import REAPER, CollectiveFailed, Group, Interrupt, settle
from slurm_elastic.worker.membership.control import ControlClient, Identity
from slurm_elastic.worker.ports import Control, Ports


def _settle() -> None:
    """Ranks as threads: before the interpreter's finalization, what their abandoned groups left blocked returns
    (`comm.settle`) and those groups are released (`Reaper.release_all`)."""
    settle(timeout_s=120.0)
    REAPER.release_all()


_settle_at_exit = threading.Lock()
_settle_registered = False


def _settle_before_exit() -> None:
    """Registered by the first thread rank a process starts, not at import: importing runs nothing."""
    global _settle_registered
    with _settle_at_exit:
        if not _settle_registered:
            atexit.register(_settle)
            _settle_registered = True


class RankDied(BaseException):
    """Raised in a thread rank to end it abruptly (a BaseException: the library must not catch it)."""


@dataclass(frozen=True)
class GroupFault:
    """In `worker`'s group of `generation` (with the groups split from it), its `nth` collective (counting from 1)
    fails.

    "raise": the collective raises, the rank lives on (a broken connection); "die": the rank dies as it
    starts the collective; "die_after": it dies once the collective completed (its sum is done);
    "raise_after": the collective completed everywhere, but this rank sees it fail. `kind` counts only
    collectives of that kind ("allreduce", "all_gather", "reduce_scatter"; "any" counts them all).
    Ranks told to die at the same collective die at once: each waits there until the others have started
    it too, so that no death breaks a collective another of them has yet to finish.
    """

    worker: str
    generation: int
    nth: int
    action: Literal["raise", "die", "die_after", "raise_after"] = "die"
    kind: Literal["any", "allreduce", "allgather", "all_gather", "reduce_scatter"] = "any"


class FaultyGroup(Group):
    """A Group whose `nth` collective fails as its GroupFault says."""

    def __init__(
        self, inner: Group, fault: GroupFault, counted: list[int] | None = None, meet: threading.Barrier | None = None
    ) -> None:
        super().__init__(
            inner.pg,
            inner.rank,
            inner.world,
            inner.generation,
            inner.interrupt,
            backend=inner.backend,
            timeout_s=inner.timeout_s,
        )
        self._fault = fault
        self._counted = counted if counted is not None else [0]  # shared with the groups split from this one
        self._meet = meet  # the ranks that die at the same collective wait for each other there

    def split(self, store: Any, prefix: str, ranks: list[int], label: str) -> Group:
        """Parts (HSDP's shard and replica groups) count their collectives with this group's."""
        part = super().split(store, prefix, ranks, label)
        return part if part is self or part.pg is None else FaultyGroup(part, self._fault, self._counted, self._meet)

    def _next(self, kind: str) -> str | None:
        """What happens after this collective completes: None, "die" or "raise"."""
        if self._fault.kind not in ("any", kind):
            return None
        self._counted[0] += 1
        count = self._counted[0]
        if count != self._fault.nth:
            return None
        if self._fault.action == "raise":
            raise CollectiveFailed(f"injected failure of collective {count} in generation {self.generation}")
        if self._fault.action == "die":
            if self._meet is not None:
                with contextlib.suppress(threading.BrokenBarrierError):
                    self._meet.wait(timeout=30)
            raise RankDied(f"died at collective {count} of generation {self.generation}")
        return "die" if self._fault.action == "die_after" else "raise"

    def _then(self, after: str | None) -> None:
        what = f"collective {self._fault.nth} of generation {self.generation}"
        if after == "die":
            raise RankDied(f"died after {what}")
        if after == "raise":
            raise CollectiveFailed(f"injected failure after {what} completed")

    def _after(self, after: str | None, wait: Callable[[], None]) -> Callable[[], None]:
        if after is None:
            return wait

        def wait_then() -> None:
            wait()
            self._then(after)

        return wait_then

    def launch_allreduce(self, tensor: torch.Tensor) -> Callable[[], None]:
        after = self._next("allreduce")
        return self._after(after, super().launch_allreduce(tensor))

    def launch_all_gather(self, output: torch.Tensor, tensor: torch.Tensor) -> Callable[[], None]:
        after = self._next("all_gather")
        return self._after(after, super().launch_all_gather(output, tensor))

    def launch_reduce_scatter(self, output: torch.Tensor, tensor: torch.Tensor) -> Callable[[], None]:
        after = self._next("reduce_scatter")
        return self._after(after, super().launch_reduce_scatter(output, tensor))

    def allreduce_(self, tensor: torch.Tensor) -> None:
        after = self._next("allreduce")
        super().allreduce_(tensor)
        self._then(after)

    def allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        after = self._next("allgather")
        out = super().allgather(tensor)
        self._then(after)
        return out


@dataclass
class _Handles:
    """What a thread rank holds that a process's death would close: its control connection and group."""

    control: Control | None = None
    group: Group | None = None

    def close(self) -> None:
        if self.group is not None:
            self.group.abandon()
        if self.control is not None:
            self.control.close()


def _meetings(faults: list[GroupFault]) -> dict[tuple[int, int, str], threading.Barrier]:
    """One meeting point per collective at which ranks die."""
    deaths = Counter((f.generation, f.nth, f.kind) for f in faults if f.action == "die")
    return {at: threading.Barrier(count) for at, count in deaths.items()}


def _ports(
    worker: str,
    node: str,
    faults: list[GroupFault],
    handles: _Handles,
    plan: FaultPlan,
    meetings: dict[tuple[int, int, str], threading.Barrier],
) -> Ports:
    mine = {f.generation: f for f in faults if f.worker == worker}

    def form(*args: Any, **kwargs: Any) -> Group:
        group = Group.form(*args, **kwargs)
        fault = mine.get(group.generation)
        meet = meetings.get((fault.generation, fault.nth, fault.kind)) if fault is not None else None
        handles.group = FaultyGroup(group, fault, meet=meet) if fault is not None else group
        return handles.group

    def control(address: str, secret: str, identity: Identity, interrupt: Interrupt) -> Control:
        handles.control = ControlClient(address, secret, identity, interrupt)
        return handles.control

    return Ports(control=control, groups=form, faults=FaultInjector(plan, node, 0, 0).attach, process_hooks=False)


@dataclass
class RankResult:
    worker: str
    value: Any = None  # what train() returned
    ending: str | None = None  # how a JobEnded ended it ("left", "stopped", ...)
    code: int | None = None
    died: bool = False
    error: BaseException | None = None


@dataclass
class ThreadJob:
    """A job whose ranks are threads of this process, around a real coordinator."""

    train: Callable[[WorkerEnv, Ports], Any]
    nodes: int
    faults: list[GroupFault] = field(default_factory=list)
    plan: FaultPlan = field(default_factory=FaultPlan)  # step faults for thread ranks ("raise", "corrupt")
    reduce_dtype: str = "float64"
    ledger_dir: Path | None = None
    heartbeat_interval_s: float = 0.2
    lease_timeout_s: float = 5.0
    pg_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        self.secret = new_secret()
        config = CoordinatorConfig(
            job_id="threads",
            secret=self.secret,
            expected_workers=self.nodes,
            heartbeat_interval_s=self.heartbeat_interval_s,
            lease_timeout_s=self.lease_timeout_s,
            hang_timeout_s=60.0,
            pg_timeout_s=self.pg_timeout_s,
            backend="gloo",
            progress_interval_s=1e9,
        )
        self.coordinator = CoordinatorThread(config).start()
        self.results: dict[str, RankResult] = {}
        self._threads: list[threading.Thread] = []
        self._next = 1
        self._meetings = _meetings(self.faults)

    def env(self, node: str) -> WorkerEnv:
        return WorkerEnv(
            coordinator=self.coordinator.address,
            secret=self.secret,
            job_id="threads",
            node=node,
            local_rank=0,
            worker_id=f"{node}:0:0",
            incarnation=0,
            run=0,
            ledger_dir=self.ledger_dir,
            checkpoint_dir=None,
            checkpoint_every=0,
            checkpoint_background=False,
            faults=FaultPlan(),
            reduce_dtype=self.reduce_dtype,
            prefetch=2,
        )

    def add_rank(self) -> str:
        _settle_before_exit()
        node = f"t{self._next}"
        self._next += 1
        env = self.env(node)
        handles = _Handles()
        ports = _ports(env.worker_id, node, self.faults, handles, self.plan, self._meetings)
        result = self.results[env.worker_id] = RankResult(env.worker_id)
        thread = threading.Thread(
            target=self._rank, args=(env, ports, handles, result), name=f"rank-{node}", daemon=True
        )
        self._threads.append(thread)
        thread.start()
        return env.worker_id

    def _rank(self, env: WorkerEnv, ports: Ports, handles: _Handles, result: RankResult) -> None:
        from slurm_elastic.worker.job import JobEnded

        try:
            result.value = self.train(env, ports)
        except RankDied:
            result.died = True
        except JobEnded as ended:
            result.ending, result.code = ended.ending.kind, ended.ending.code
        except BaseException as exc:  # reported to the test
            result.error = exc
        finally:
            handles.close()  # what the kernel does when a process ends

    def start(self) -> ThreadJob:
        for _ in range(self.nodes):
            self.add_rank()
        return self

    def wait_step(self, step: int, timeout: float = 60.0) -> None:
        wait_until(
            lambda: self.coordinator.view().last_step >= step,
            timeout=timeout,
            what=f"thread job's step {step} ({self.coordinator.view().reason})",
            poll=0.01,
        )

    def join(self, timeout: float = 120.0) -> dict[str, RankResult]:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise TimeoutError(f"thread job: ranks still running after {timeout} s: {alive}")
        return self.results

    def run(self, timeout: float = 120.0) -> dict[str, RankResult]:
        try:
            return self.start().join(timeout)
        finally:
            self.stop()

    def stop(self) -> None:
        self.coordinator.stop()
