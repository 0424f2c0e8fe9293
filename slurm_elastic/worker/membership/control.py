"""The worker's connection to the coordinator: registration, heartbeats, and announcements.

A reader thread receives announcements. An abrupt generation change, a `Leave`, a `Stop` or the loss
of the coordinator fires the worker's `Interrupt`, so a main thread blocked in a collective wakes up
at once; a graceful change only raises a flag that the next reduction carries to every rank. If the reader
or the heartbeat thread dies, the worker tells the coordinator why and leaves the job (`ControlFailed`),
rather than fall silent until its lease expires.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from pydantic import BaseModel

from slurm_elastic.decide.health import stalled_for
from slurm_elastic.errors import InvalidMessage
from slurm_elastic.loops import start_thread
from slurm_elastic.wire.channel import Channel, connect
from slurm_elastic.wire.messages import (
    Assign,
    ChangePending,
    Heartbeat,
    Leave,
    Phase,
    Register,
    Registered,
    Stop,
    WorkerEvent,
    WorkerSettings,
)
from slurm_elastic.worker.membership.comm import Interrupt

Announcement = Assign | Leave | Stop
CONNECT_RETRY_S = 30.0  # a coordinator under a flood of idle connections may evict a handshake or two


@dataclass(frozen=True)
class Identity:
    job_id: str
    worker_id: str
    node: str
    local_rank: int


class CoordinatorLost(ConnectionError):
    """The control connection closed: the coordinator is gone."""


class ControlFailed(Exception):
    """A thread of this worker's control connection died: the worker cannot hear or be heard any more."""


class JobOver(Exception):
    """The coordinator turned the registration down because the job has ended."""


class ControlClient:
    def __init__(self, address: str, secret: str, identity: Identity, interrupt: Interrupt) -> None:
        self.identity = identity
        self.interrupt = interrupt
        self._address = address
        self._secret = secret
        self._channel: Channel | None = None
        self._cond = threading.Condition()
        self._latest: Announcement | None = None
        self._known: Assign | None = None  # the last generation's assign, whole: the next may be a change of it
        self._current_generation = 0
        self._change_generation = 0
        self._lost = False
        self._failure: str | None = None  # why a control thread died, if one did
        self._last_heard = time.monotonic()  # the coordinator's last message (it pulses every interval)
        self._closed = threading.Event()
        self.progress: tuple[int, int, Phase] = (0, -1, "init")
        self.settings: WorkerSettings | None = None

    # -- life cycle ----------------------------------------------------------------------------------

    def register(self, committed_step: int, pid: int) -> WorkerSettings:
        ident = self.identity
        self._channel = connect(
            self._address, secret=self._secret, job_id=ident.job_id, role="worker", retry_s=CONNECT_RETRY_S
        )
        self._channel.send(
            Register(
                worker_id=ident.worker_id,
                node=ident.node,
                local_rank=ident.local_rank,
                pid=pid,
                committed_step=committed_step,
            )
        )
        reply = self._channel.recv(timeout=60)
        if isinstance(reply, Stop):
            raise JobOver(reply.reason)
        if not isinstance(reply, Registered):
            raise CoordinatorLost(f"expected 'registered', got {reply.type!r}")
        self.settings = reply.settings
        start_thread("se-control", self._read_loop, self._thread_died)
        start_thread("se-heartbeat", self._heartbeat_loop, self._thread_died)
        return reply.settings

    def close(self) -> None:
        self._closed.set()
        if self._channel is not None:
            self._channel.close()

    def send(self, msg: BaseModel) -> None:
        if self._channel is None or self._lost:
            return
        try:
            self._channel.send(msg)
        except OSError:
            self._on_lost()

    # -- what the main thread asks -------------------------------------------------------------------

    def enter_generation(self, generation: int) -> None:
        """The main thread now works in `generation`; only newer announcements interrupt it."""
        with self._cond:
            self._current_generation = generation
            if not self._superseded_locked():
                self.interrupt.clear()

    def change_requested(self) -> bool:
        return self._change_generation >= self._current_generation > 0

    def next_announcement(self, after: int, timeout: float | None = None) -> Announcement | None:
        """Wait for an announcement newer than generation `after`; None on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                latest = self._latest
                if self._failure is not None:
                    raise ControlFailed(self._failure)
                if self._lost:
                    raise CoordinatorLost("lost the connection to the coordinator")
                if isinstance(latest, Leave | Stop):
                    return latest
                if isinstance(latest, Assign) and latest.generation > after:
                    return latest
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)

    # -- reader and heartbeat threads ----------------------------------------------------------------

    def _superseded_locked(self) -> bool:
        latest = self._latest
        if isinstance(latest, Leave | Stop) or self._lost or self._failure is not None:
            return True
        return (
            isinstance(latest, Assign) and latest.generation > self._current_generation and latest.boundary_step is None
        )

    def _read_loop(self) -> None:
        assert self._channel is not None
        while not self._closed.is_set():
            try:
                msg = self._channel.recv()
            except InvalidMessage:
                continue  # one bad frame costs that frame, not the connection
            except (OSError, ConnectionError, ValueError):
                self._on_lost()
                return
            self._last_heard = time.monotonic()
            if isinstance(msg, Assign):  # an unresolvable change raises: this thread dies, saying why
                msg = self._known = msg.resolved(self._known)
            with self._cond:
                if isinstance(msg, ChangePending):
                    self._change_generation = max(self._change_generation, msg.generation)
                elif isinstance(msg, Assign | Leave | Stop):
                    if not (isinstance(self._latest, Leave | Stop)):
                        self._latest = msg
                    if self._superseded_locked():
                        self.interrupt.set()
                self._cond.notify_all()

    def _thread_died(self, reason: str) -> None:
        """Tell the coordinator why (not a silent lease expiry), and wake the main thread to leave the job."""
        with self._cond:
            self._failure = self._failure or reason
            self.interrupt.set()
            self._cond.notify_all()
        self.send(WorkerEvent(kind="control_loop_failed", fields={"reason": reason}))

    def _on_lost(self) -> None:
        if self._closed.is_set():
            return
        with self._cond:
            self._lost = True
            self.interrupt.set()
            self._cond.notify_all()

    def _heartbeat_loop(self) -> None:
        assert self.settings is not None
        interval, lease = self.settings.heartbeat_interval_s, self.settings.lease_timeout_s
        previous = time.monotonic()
        while not self._closed.wait(interval) and not self._lost:
            now = time.monotonic()
            self._last_heard += stalled_for(previous, now, interval)  # our own stop is not its silence
            previous = now
            if now - self._last_heard > lease:
                # A batch host that vanished without a TCP reset: no pulse for a lease.
                self._on_lost()
                if self._channel is not None:
                    self._channel.close()  # wakes the reader blocked in recv()
                return
            generation, step, phase = self.progress
            self.send(Heartbeat(generation=generation, step=step, phase=phase))
