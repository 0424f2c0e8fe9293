"""A node's rendezvous-store relay, run by its agent: the node's workers open their store connections to it
(an abstract Unix socket of a random name: nothing in the filesystem to plant, or to leave behind
when the agent is killed; the job's secret proven both ways, as at the coordinator), and it
carries their requests to the coordinator's store over one connection of its own.

Why: forming a generation's groups costs the coordinator, per rank, a handshake (a rank opens a fresh store
connection per generation), a request and a reply; at 16,384 ranks that is seconds of its one core. Through
the relay it costs one connection per node for the job's life, and one request per node for each key that
the node's ranks read together: identical blocking reads (get, wait, multi_get of the same keys, the same
timeout) in flight at the same time go upstream as one, and its reply is handed to each. A read that joins
one in flight returns what the key held when that read was answered upstream; for the write-once keys of a
group's rendezvous, that is what a read of its own would return. Writes are never merged, and a
connection's requests go upstream in the order they came.

The same socket serves the node's control relay (controlrelay), where the agent runs one: the role a
connection proves decides which relay serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import secrets
import threading
from collections.abc import Callable

from slurm_elastic.agentspec import HEARTBEAT_INTERVAL_S
from slurm_elastic.controlrelay import ControlRelay
from slurm_elastic.errors import AuthError, ProtocolError
from slurm_elastic.logs import get_logger
from slurm_elastic.wire.channel import (
    UNIX_PREFIX,
    HandshakeGate,
    accept_handshake,
    encode_frame,
    open_peer,
    read_message,
    unix_path,
    write_message,
)
from slurm_elastic.wire.messages import Pulse, StoreReply, StoreRequest

__all__ = ["RelayThread", "StoreRelay", "Upstream"]

log = get_logger("slurm_elastic.relay")
MERGED_OPS = frozenset({"get", "wait", "multi_get"})
Deliver = Callable[[StoreReply], None]


class Upstream:
    """The relay's one store connection to the coordinator: requests under ids of its own, replies handed to
    every caller that shares them."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._ids = itertools.count(1)
        self._callers: dict[int, list[tuple[int, Deliver]]] = {}  # upstream id -> (caller's id, deliver)
        self._in_flight: dict[tuple[object, ...], int] = {}  # a mergeable read -> its upstream id
        self._read_of: dict[int, tuple[object, ...]] = {}
        self.lost: str | None = None
        self.merged = 0

    def call(self, request: StoreRequest, deliver: Deliver) -> None:
        """Send `request` on (or let it share an identical read in flight); `deliver` gets its reply, under
        the request's own id, from the loop's thread."""
        if self.lost is not None:
            deliver(StoreReply(id=request.id, ok=False, error=self.lost))
            return
        read = (request.op, *request.keys, request.timeout_ms) if request.op in MERGED_OPS else None
        if read is not None and (shared := self._in_flight.get(read)) is not None:
            self._callers[shared].append((request.id, deliver))
            self.merged += 1
            return
        upstream_id = next(self._ids)
        self._callers[upstream_id] = [(request.id, deliver)]
        if read is not None:
            self._in_flight[read] = upstream_id
            self._read_of[upstream_id] = read
        write_message(self.writer, request.model_copy(update={"id": upstream_id}))

    async def read_replies(self) -> None:
        """Hand each reply to its callers until the connection ends; then every call in flight fails."""
        reason = "the coordinator closed the store connection"
        try:
            while True:
                reply = await read_message(self.reader)
                if not isinstance(reply, StoreReply):
                    raise ProtocolError(f"the coordinator's store sent {reply.type!r}, not a store reply")
                self._settle(reply)
        except (ConnectionError, asyncio.IncompleteReadError, ProtocolError) as exc:
            reason = f"{reason}: {exc}" if isinstance(exc, ProtocolError) else reason
        finally:
            self.lose(reason)

    def lose(self, reason: str) -> None:
        """The connection is gone: fail every call in flight, and every later one, with `reason`."""
        if self.lost is None:
            self.lost = f"store relay: {reason}"[:2000]
        for upstream_id in list(self._callers):
            self._settle(StoreReply(id=upstream_id, ok=False, error=self.lost))
        self.writer.close()

    def _settle(self, reply: StoreReply) -> None:
        read = self._read_of.pop(reply.id, None)
        if read is not None:
            del self._in_flight[read]
        for caller_id, deliver in self._callers.pop(reply.id, ()):
            deliver(reply.model_copy(update={"id": caller_id}))


class StoreRelay:
    """Serves a node's store connections through one `Upstream`, opened when the first one comes and again
    after it was lost."""

    def __init__(self, coordinator: str, secret: str, job_id: str) -> None:
        self.coordinator, self._secret, self.job_id = coordinator, secret, job_id
        self.upstream: Upstream | None = None
        self._opening = asyncio.Lock()
        self._reader_task: asyncio.Task[None] | None = None
        self._downstream: set[asyncio.StreamWriter] = set()

    async def connected(self) -> Upstream:
        async with self._opening:
            if self.upstream is None or self.upstream.lost is not None:
                reader, writer = await open_peer(self.coordinator, self._secret, self.job_id, "store")
                self.upstream = upstream = Upstream(reader, writer)
                self._reader_task = asyncio.create_task(self._read(upstream))
            return self.upstream

    async def _read(self, upstream: Upstream) -> None:
        await upstream.read_replies()
        for writer in list(self._downstream):  # the workers' stores see their connection end, as if direct
            writer.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = await self.connected()
        self._downstream.add(writer)
        try:
            while upstream.lost is None:
                request = await read_message(reader)
                if not isinstance(request, StoreRequest):
                    raise ProtocolError(f"a store connection may send store requests only, not {request.type!r}")
                upstream.call(request, functools.partial(_answer, writer))
                await upstream.writer.drain()  # the coordinator reads slower than the node writes: wait
        finally:
            self._downstream.discard(writer)

    def close(self) -> None:
        for writer in list(self._downstream):
            writer.close()
        if self.upstream is not None:
            self.upstream.lose("the relay stopped")
        if self._reader_task is not None:
            self._reader_task.cancel()


def _answer(writer: asyncio.StreamWriter, reply: StoreReply) -> None:
    if not writer.is_closing():  # a worker that left no longer hears its replies
        write_message(writer, reply)


class RelayThread:
    """A node agent's relays: the store relay and, with `control`, the control relay (controlrelay), on one
    event loop on a daemon thread, listening on an abstract Unix socket of a random name. `address` is what
    the workers' store and control connections open; the role each proves says which relay serves it."""

    def __init__(
        self, coordinator: str, secret: str, job_id: str, *, control: bool = False, beat_s: float = HEARTBEAT_INTERVAL_S
    ) -> None:
        self.relay: StoreRelay | None = None
        self.control: ControlRelay | None = None
        self._args = (coordinator, secret, job_id)
        self._control, self._beat_s = control, beat_s
        self.gate = HandshakeGate()
        self.address = f"{UNIX_PREFIX}@slurm-elastic-relay-{secrets.token_hex(8)}"
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="se-node-relay", daemon=True)

    def start(self) -> RelayThread:
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            self.stop()
            raise self._error
        return self

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One worker's connection: the handshake, then the relay of its role serves it until it closes."""
        try:
            self.gate.enter(writer)
            try:
                role = await accept_handshake(reader, writer, secret=self._args[1], job_id=self._args[2])
            finally:
                self.gate.leave(writer)
            if role == "store" and self.relay is not None:
                await self.relay.serve(reader, writer)
            elif role == "worker" and self.control is not None:
                await self.control.serve(reader, writer)
            else:
                raise ProtocolError(f"this node's relay does not serve a {role}")
        except (AuthError, ProtocolError) as exc:
            log.warning("relay_refused", reason=str(exc)[:200])
        except (OSError, asyncio.IncompleteReadError):
            pass  # the worker went, or the coordinator cannot be reached: the worker's side says so
        finally:
            writer.close()

    def pulse(self, pulse: Pulse) -> None:
        """Hand the coordinator's pulse, which came to the agent, to every worker of the control relay."""
        if self._control and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the relay stopped meanwhile (its loop closed)
                self._loop.call_soon_threadsafe(self._pulse, encode_frame(pulse))

    def _pulse(self, frame: bytes) -> None:
        if self.control is not None:
            self.control.pulse(frame)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self.relay = StoreRelay(*self._args)
            self.control = ControlRelay(*self._args, beat_s=self._beat_s) if self._control else None
            server = self._loop.run_until_complete(asyncio.start_unix_server(self._on_connect, unix_path(self.address)))
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._started.set()
            return
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self.relay.close()
            if self.control is not None:
                self.control.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            if tasks:
                self._loop.run_until_complete(asyncio.wait(tasks, timeout=2))
            self._loop.close()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
