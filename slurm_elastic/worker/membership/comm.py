"""The process group of one generation, with collectives that a generation change can interrupt.

A blocked collective cannot be cancelled in torch, so every wait is a wait on an event that either the
collective's completion or the control thread (a newer generation was announced) sets. An interrupted
group is abandoned: aborted, and never used again. Its buffers are never reused either, because a late
completion of the abandoned work could still write into them.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from slurm_elastic.errors import ConfigError, ElasticError
from slurm_elastic.worker.membership.helpers import HELPERS


class Interrupted(ElasticError):
    """A newer generation was announced (or the worker must leave) while waiting."""


class CollectiveFailed(ElasticError):
    """A collective raised: a peer died or the connection broke."""


class Waiter:
    """One wait: woken by completion (`complete()`) or by the interrupt, and it knows which."""

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.completed = False

    def complete(self) -> None:
        self.completed = True
        self.wake.set()


class Interrupt:
    """Set by the control thread when the current generation is superseded; wakes every waiter."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._waiters: set[Waiter] = set()

    def set(self) -> None:
        with self._lock:
            self._set = True
            for waiter in self._waiters:
                waiter.wake.set()

    def clear(self) -> None:
        with self._lock:
            self._set = False

    def is_set(self) -> bool:
        return self._set

    def wait(self, waiter: Waiter, timeout: float | None = None) -> bool:
        """Block until the waiter completes or the interrupt fires; returns whether it completed."""
        with self._lock:
            if self._set:
                return waiter.completed
            self._waiters.add(waiter)
        try:
            waiter.wake.wait(timeout)
        finally:
            with self._lock:
                self._waiters.discard(waiter)
        return waiter.completed


class Reaper:
    """Releases abandoned process groups on a thread of its own, `delay_s` after they were aborted: a group's
    destructor may wait for a collective still blocked in it, which must never hold up the training
    thread, and a group kept forever would keep its sockets and its store connection (one per generation)."""

    def __init__(self, delay_s: float = 2.0) -> None:
        self.delay_s = delay_s
        self._cond = threading.Condition()
        self._held: list[tuple[float, Any]] = []
        self._releasing = 0
        self._thread: threading.Thread | None = None

    def hold(self, pg: Any) -> None:
        with self._cond:
            self._held.append((time.monotonic() + self.delay_s, pg))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="se-reaper", daemon=True)
                self._thread.start()
            self._cond.notify()

    def release_all(self) -> None:
        """Release the groups held now. For processes whose ranks are threads (the in-process test doubles)
        at exit: left to the end of finalization, a gloo group's destructor ran with its threads still
        joinable and the process aborted (exit code 134) after an ordinary end. Not for workers: there
        destroying a group waits on peers that went on, and a drained worker's exit would take seconds."""
        with self._cond:
            held, self._held = self._held, []
        del held

    def holding(self) -> int:
        """Groups not yet released (or being released right now)."""
        with self._cond:
            return len(self._held) + self._releasing

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._held or self._held[0][0] > time.monotonic():
                    self._cond.wait(None if not self._held else self._held[0][0] - time.monotonic())
                _, pg = self._held.pop(0)
                self._releasing += 1
            del pg  # the destructor runs here, outside the lock, if that was the last reference
            with self._cond:
                self._releasing -= 1


REAPER = Reaper()


class Awaited:
    """Collectives whose completion callback has not run yet. The group's own C++ thread runs the callback,
    a Python function, and then drops it, both with the GIL: when an abandoned group's collective ends (at
    its timeout) during the interpreter's finalization, that thread cannot take the GIL and the process
    aborts (exit code 134)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0

    def on_completion(self, future: Any, callback: Callable[[], None]) -> None:
        with self._cond:
            self._count += 1

        def done(_: Any) -> None:
            try:
                callback()
            finally:
                with self._cond:
                    self._count -= 1
                    self._cond.notify_all()

        future.add_done_callback(done)

    def count(self) -> int:
        with self._cond:
            return self._count

    def settle(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for every callback to run; the number still waiting."""
        with self._cond:
            self._cond.wait_for(lambda: not self._count, timeout_s)
            return self._count

    def _forget(self) -> None:
        """In a forked child: the groups' threads were not copied, so their callbacks will never run there."""
        self._cond = threading.Condition()
        self._count = 0


AWAITED = Awaited()
os.register_at_fork(after_in_child=AWAITED._forget)


def leftovers() -> bool:
    """Whether abandoned process groups, their collectives or blocked helper threads remain (they outlive a
    recovery)."""
    return bool(HELPERS.busy() or REAPER.holding() or AWAITED.count())


def settle(timeout_s: float) -> bool:
    """For processes whose ranks are threads (the in-process test doubles), before they exit: wait up to
    `timeout_s` for what abandoned groups left blocked (helper calls, collectives) to return, as each does
    within its group's timeout. Returns whether everything did."""
    deadline = time.monotonic() + timeout_s
    left = HELPERS.settle(timeout_s) + AWAITED.settle(max(0.0, deadline - time.monotonic()))
    # a callback's C++ thread drops the callback just after it ran (with the GIL): let it
    time.sleep(0.05)
    return not left


def run_interruptibly(fn: Callable[[], Any], interrupt: Interrupt, what: str) -> Any:
    """Run a blocking call on a helper thread (`worker/helpers.py`); raise Interrupted if the interrupt fires
    first."""
    waiter = Waiter()
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # reported to the waiting thread below
            box["error"] = exc

    HELPERS.submit(call, waiter.complete, what)
    if not interrupt.wait(waiter):
        raise Interrupted(what)
    if "error" in box:
        raise CollectiveFailed(f"{what}: {box['error']}") from box["error"]
    return box["value"]


def _wait_work(work: Any, interrupt: Interrupt, what: str) -> None:
    try:
        future = work.get_future()
    except RuntimeError:  # gloo send/recv have no future: wait on a helper thread instead
        run_interruptibly(work.wait, interrupt, what)
        return
    waiter = Waiter()
    AWAITED.on_completion(future, waiter.complete)
    if not interrupt.wait(waiter):
        raise Interrupted(what)
    try:
        work.wait()  # done already: raises its error
    except Exception as exc:
        raise CollectiveFailed(f"{what}: {exc}") from exc


def _poll_work(work: Any, interrupt: Interrupt, what: str) -> None:
    """Wait for an NCCL collective to end on the GPU, listening for the interrupt. Its future completes once
    the collective is queued, and a host sync behind a collective whose peer died blocks for good (seen on an
    H200: the training thread stuck in `.item()` after the reduction's wait): so poll the work's own CUDA
    events and error, and leave the GPU to `abandon`'s abort when the generation is superseded."""
    pause = 0.0
    while not work.is_completed():
        if interrupt.is_set():
            raise Interrupted(what)
        time.sleep(pause)
        pause = min(pause + 5e-5, 1e-3)  # a step's sums end within microseconds of each other: poll fast first
    try:
        work.wait()  # ended: raises its error (a dead peer's, a timeout's) and orders this stream after it
    except Exception as exc:
        raise CollectiveFailed(f"{what}: {exc}") from exc


def _started(start: Callable[[], Any], what: str) -> Any:
    """The work `start()` returns. A collective can fail as it starts: gloo's, when a peer's connection
    already closed (the peer died); NCCL's, on an aborted communicator. That is a failed collective, not an
    error of the user's code."""
    try:
        return start()
    except RuntimeError as exc:
        raise CollectiveFailed(f"{what} could not start: {exc}") from exc


def pick_backend(requested: str, device: torch.device) -> str:
    """The process groups' backend for a model on `device`: "auto" is NCCL for a model on a GPU and gloo for
    one on the CPU, whatever else the host has; NCCL's collectives take CUDA tensors only."""
    if requested == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if requested == "nccl" and device.type != "cuda":
        raise ConfigError(f"backend 'nccl' needs the model on a CUDA device, not {device.type}; use 'gloo' or 'auto'")
    return requested


class Group:
    """Rank `rank` of `world` in generation `generation`; world 1 needs no process group at all."""

    def __init__(
        self,
        pg: Any,
        rank: int,
        world: int,
        generation: int,
        interrupt: Interrupt,
        *,
        backend: str = "gloo",
        timeout_s: float = 60.0,
    ) -> None:
        self.pg = pg
        self.rank = rank
        self.world = world
        self.generation = generation
        self.interrupt = interrupt
        self.backend, self.timeout_s = backend, timeout_s  # what `split` forms its groups with
        self._parts: list[Group] = []

    @property
    def device(self) -> torch.device:
        """Where this group's tensors must live: the current GPU for NCCL, else the CPU."""
        if self.pg is not None and self.pg.name() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    @classmethod
    def form(
        cls,
        store: Any,
        prefix: str,
        rank: int,
        world: int,
        generation: int,
        *,
        backend: str,
        timeout_s: float,
        interrupt: Interrupt,
    ) -> Group:
        # The generation's keys live under `<prefix>/g<N>/`: the store drops them with the generation.
        scoped = dist.PrefixStore(f"{prefix}/g{generation}", store) if world > 1 else None
        return cls._formed(scoped, rank, world, generation, backend, timeout_s, interrupt)

    @classmethod
    def _formed(
        cls, scoped: Any, rank: int, world: int, generation: int, backend: str, timeout_s: float, interrupt: Interrupt
    ) -> Group:
        if world == 1:
            return cls(None, 0, 1, generation, interrupt, backend=backend, timeout_s=timeout_s)
        timeout = datetime.timedelta(seconds=timeout_s)

        def make() -> Any:
            if backend == "nccl":
                # The library aborts a failed generation's communicator itself; NCCL's watchdog must not
                # tear the whole process down when it sees that (its default since torch 2.2).
                os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                return dist.ProcessGroupNCCL(scoped, rank, world, opts)
            return dist.ProcessGroupGloo(scoped, rank, world, timeout)

        pg = run_interruptibly(make, interrupt, f"forming generation {generation}")
        return cls(pg, rank, world, generation, interrupt, backend=backend, timeout_s=timeout_s)

    def split(self, store: Any, prefix: str, ranks: list[int], label: str) -> Group:
        """The group of `ranks` (this generation's ranks, this one among them, in order), formed by those
        ranks under the same `label`; abandoned with this group. Every rank forms its parts in the same order."""
        if ranks == list(range(self.world)):
            return self
        scoped = dist.PrefixStore(f"{prefix}/g{self.generation}/{label}", store)  # dropped with the generation
        args = (ranks.index(self.rank), len(ranks), self.generation, self.backend, self.timeout_s, self.interrupt)
        part = Group._formed(scoped, *args)
        self._parts.append(part)
        return part

    def allreduce_(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over the group, in place."""
        self._launch(lambda: self.pg.allreduce([tensor]), "allreduce")()

    def launch_allreduce(self, tensor: torch.Tensor) -> Callable[[], None]:
        """Start a sum and return the function that waits for it (lets a fault fire mid-flight)."""
        return self._launch(lambda: self.pg.allreduce([tensor]), "allreduce")

    def launch_all_gather(self, output: torch.Tensor, tensor: torch.Tensor) -> Callable[[], None]:
        """Start gathering every rank's `tensor` into `output` (rank order, concatenated); returns the wait."""
        return self._launch(lambda: self.pg._allgather_base(output, tensor), "all-gather")

    def launch_reduce_scatter(self, output: torch.Tensor, tensor: torch.Tensor) -> Callable[[], None]:
        """Start summing `tensor` over the ranks and keeping this rank's slice in `output`; returns the wait."""
        return self._launch(lambda: self.pg._reduce_scatter_base(output, tensor), "reduce-scatter")

    def _launch(self, start: Callable[[], Any], what: str) -> Callable[[], None]:
        if self.pg is None:
            return lambda: None
        work = _started(start, what)
        return lambda: self._wait(work, what)

    def _wait(self, work: Any, what: str) -> None:
        if self.backend == "nccl":
            _poll_work(work, self.interrupt, what)
        else:
            _wait_work(work, self.interrupt, what)

    def allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        if self.pg is None:
            return [tensor.clone()]
        out = [torch.empty_like(tensor) for _ in range(self.world)]
        self._launch(lambda: self.pg.allgather([out], [tensor]), "allgather")()
        return out

    def exchange(self, sends: list[tuple[torch.Tensor, int, int]], recvs: list[tuple[torch.Tensor, int, int]]) -> None:
        """Point-to-point: (tensor, peer, tag) pairs; all are started before any is waited on."""
        ops = [(self.pg.send, *s) for s in sends] + [(self.pg.recv, *r) for r in recvs]
        works = [_started(functools.partial(op, [t], peer, tag), "state transfer") for op, t, peer, tag in ops]
        for work in works:
            self._wait(work, "state transfer")

    def abandon(self) -> None:
        for part in self._parts:
            part.abandon()
        self._parts.clear()
        if self.pg is None:
            return
        with contextlib.suppress(RuntimeError):
            self.pg.abort()
        REAPER.hold(self.pg)
        self.pg = None
