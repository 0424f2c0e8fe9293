"""A node's control relay, at the coordinator: the node's workers come over its agent's relay (controlrelay),
all on one connection. Each is served as a direct worker is (`serve_worker`), from a reader fed with its
frames and a writer that wraps what the coordinator writes to it; their heartbeats come together, one frame
per node and interval, and a generation's assignments go to them together, one `Assigns` per node."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Container
from typing import Any

from slurm_elastic.coordinator.peers import PeerWriter
from slurm_elastic.decide.membership import Generation
from slurm_elastic.errors import InvalidMessage, ProtocolError
from slurm_elastic.events import EventLog
from slurm_elastic.eventtypes import MessageDropped
from slurm_elastic.wire import messages as msg
from slurm_elastic.wire.channel import decode_body, encode_frame, frame_of, read_message

__all__ = ["NodeAssigns", "RelayedWriter", "serve_relay"]

Writer = asyncio.StreamWriter
ServeWorker = Callable[[msg.Register, asyncio.StreamReader, "RelayedWriter"], Awaitable[None]]
OnBeats = Callable[[list[msg.Beat], Container[str]], None]


class RelayedWriter:
    """What the coordinator writes to one relayed worker, wrapped for the node's relay. Closing it tells the
    relay to close that worker's connection."""

    def __init__(self, relay: Writer, worker: str) -> None:
        self.relay, self.worker = relay, worker
        self._closed = False

    def write(self, frame: bytes) -> None:
        if not self.is_closing():
            self.relay.write(encode_frame(msg.Relayed(worker=self.worker, frame=frame[4:].decode())))

    def is_closing(self) -> bool:
        return self._closed or self.relay.is_closing()

    def close(self) -> None:
        if not self.is_closing():
            self.relay.write(encode_frame(msg.RelayClosed(worker=self.worker)))
        self._closed = True


class NodeAssigns:
    """A generation's Assigns to relayed workers, one `Assigns` per relay (and, for newcomers, one `Roster` of
    the whole ranks, encoded once), instead of a frame per worker: at 32,768 ranks a change cost the
    coordinator 32,768 encodings; now one per node."""

    def __init__(self, gen: Generation, change: dict[str, Any] | None) -> None:
        self.gen, self.change = gen, change  # the change since the previous generation, where there is one
        self._whole: dict[int, tuple[Writer, list[tuple[str, int]]]] = {}
        self._changed: dict[int, tuple[Writer, list[tuple[str, int]]]] = {}

    def add(self, writer: PeerWriter, worker: str, rank: int, whole: bool) -> bool:
        """Take `worker`'s Assign if it is relayed (True); a direct worker gets its own (False)."""
        if not isinstance(writer, RelayedWriter):
            return False
        if not writer.is_closing():
            batch = self._whole if whole else self._changed
            batch.setdefault(id(writer.relay), (writer.relay, []))[1].append((worker, rank))
        return True

    def send(self) -> None:
        gen = self.gen
        at = {"generation": gen.number, "boundary_step": gen.boundary_step, "cause": gen.cause}
        if self._whole:
            roster = encode_frame(msg.Roster(generation=gen.number, ranks=list(gen.ranks)))
            for relay, members in self._whole.values():
                relay.write(roster)
                relay.write(encode_frame(msg.Assigns(**at, members=members)))
        for relay, members in self._changed.values():
            relay.write(encode_frame(msg.Assigns(**at, members=members, **(self.change or {}))))


async def serve_relay(
    first: msg.Message,
    reader: asyncio.StreamReader,
    writer: Writer,
    serve_worker: ServeWorker,
    on_beats: OnBeats,
    events: EventLog,
) -> None:
    """Serve one relay's connection until it ends; then each of its workers' ends as a closed connection."""
    relay = _Relay(writer, serve_worker, on_beats, events)
    message: msg.Message | None = first
    try:
        while True:
            if message is not None:
                relay.on_message(message)
            try:
                message = await read_message(reader)
            except InvalidMessage as exc:
                events.record(MessageDropped("a node's relay", str(exc)))
                message = None
    finally:
        await relay.close()


class _Relay:
    def __init__(self, writer: Writer, serve_worker: ServeWorker, on_beats: OnBeats, events: EventLog) -> None:
        self.writer, self.serve_worker, self.on_beats, self.events = writer, serve_worker, on_beats, events
        self.readers: dict[str, asyncio.StreamReader] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def on_message(self, message: msg.Message) -> None:
        match message:
            case msg.Relayed():
                self._relayed(message.worker, message.frame)
            case msg.Beats():
                self.on_beats(message.beats, self.readers)  # a relay speaks for its own workers only
            case msg.RelayClosed():
                if (reader := self.readers.pop(message.worker, None)) is not None:
                    reader.feed_eof()
            case _:
                self.events.record(MessageDropped("a node's relay", f"unexpected {message.type!r}"))

    def _relayed(self, worker: str, frame: str) -> None:
        body = frame.encode()
        if (reader := self.readers.get(worker)) is not None:
            reader.feed_data(frame_of(body))
            return
        try:  # a worker's first frame: its registration, under the name the relay gave it
            register = decode_body(body)
            if not isinstance(register, msg.Register) or register.worker_id != worker:
                raise ProtocolError(f"relayed worker {worker!r} did not open with its own registration")
        except (InvalidMessage, ProtocolError) as exc:
            self.events.record(MessageDropped("a node's relay", str(exc)[:500]))
            self.writer.write(encode_frame(msg.RelayClosed(worker=worker)))
            return
        reader = self.readers[worker] = asyncio.StreamReader()
        task = asyncio.get_running_loop().create_task(self._serve(register, reader, RelayedWriter(self.writer, worker)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _serve(self, register: msg.Register, reader: asyncio.StreamReader, writer: RelayedWriter) -> None:
        try:
            await self.serve_worker(register, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, ProtocolError):
            pass  # its connection ended (the relay said so, or the relay's own ended): served as lost
        finally:
            writer.close()
            if self.readers.get(writer.worker) is reader:
                del self.readers[writer.worker]

    async def close(self) -> None:
        for reader in self.readers.values():
            reader.feed_eof()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
