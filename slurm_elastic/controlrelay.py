"""A node's control relay, run by its agent beside the store relay (on the same abstract socket, the secret
proven both ways: rendezvous.relay). The node's workers open their control connections to it, and it carries
them all to the coordinator over one connection of its own (role "relay"): the coordinator holds one
connection per node, however many workers each node runs.

Each worker's messages go up whole and in order (`Relayed`), except its heartbeats: the relay keeps each
worker's latest and sends them together once an interval (`Beats`), and before any other message of the
node, so that the coordinator never sees a worker's progress out of order. The coordinator's pulse comes
once per node, to its agent, which hands it to the relay for every worker; a generation's assignments come
once per node too (one `Assigns`, after one `Roster` of the whole ranks where newcomers need them), and
the relay writes each worker its Assign. What the coordinator sends one worker comes `Relayed` and goes to
that worker alone. A worker's connection that ends is told up (`RelayClosed`), as a closed connection
would be; when the relay's own connection ends, it closes every worker's, as the coordinator's loss would.
"""

from __future__ import annotations

import asyncio

from slurm_elastic.agentspec import HEARTBEAT_INTERVAL_S
from slurm_elastic.errors import InvalidMessage, ProtocolError
from slurm_elastic.logs import get_logger
from slurm_elastic.wire import messages as msg
from slurm_elastic.wire.channel import decode_body, encode_frame, frame_of, open_peer, read_body, read_message

__all__ = ["ControlRelay"]

log = get_logger("slurm_elastic.relay")
REGISTER_TIMEOUT_S = 30.0  # as the coordinator waits for a direct worker's registration


class _Upstream:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer


class ControlRelay:
    """Serves a node's control connections through one upstream connection, opened when the first worker
    comes and again after it was lost."""

    def __init__(self, coordinator: str, secret: str, job_id: str, beat_s: float = HEARTBEAT_INTERVAL_S) -> None:
        self.coordinator, self._secret, self.job_id, self.beat_s = coordinator, secret, job_id, beat_s
        self.upstream: _Upstream | None = None
        self.workers: dict[str, asyncio.StreamWriter] = {}
        self._answered: set[str] = set()  # workers whose registration the coordinator answered: pulses go to them
        self._beats: dict[str, msg.Beat] = {}
        self._opening = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One worker's control connection, after its handshake: its registration, then its messages."""
        register = await asyncio.wait_for(read_message(reader), REGISTER_TIMEOUT_S)
        if not isinstance(register, msg.Register):
            raise ProtocolError(f"a worker must open with its registration, not {register.type!r}")
        wid = register.worker_id
        if wid in self.workers:
            raise ProtocolError(f"worker {wid} is already connected to this node's relay")
        up = await self._connected()
        self.workers[wid] = writer
        try:
            self._up(up, msg.Relayed(worker=wid, frame=register.model_dump_json()))
            while not up.writer.is_closing():
                body = await read_body(reader)
                self._from_worker(up, wid, body)
                await up.writer.drain()  # the coordinator reads slower than the node writes: wait
        finally:
            if self.workers.get(wid) is writer:
                del self.workers[wid]
                self._beats.pop(wid, None)
                self._answered.discard(wid)
                if not up.writer.is_closing():
                    self._up(up, msg.RelayClosed(worker=wid))

    def _from_worker(self, up: _Upstream, wid: str, body: bytes) -> None:
        try:
            message = decode_body(body)
        except InvalidMessage:  # the coordinator judges it, as it would a direct worker's (and says so)
            message = None
        if isinstance(message, msg.Heartbeat):
            self._beats[wid] = (wid, message.generation, message.step, message.phase)
        else:
            self._up(up, msg.Relayed(worker=wid, frame=body.decode(errors="replace")))

    def _up(self, up: _Upstream, message: msg.Relayed | msg.RelayClosed) -> None:
        self._send_beats(up)  # first: a worker's progress is never seen after what it did next
        up.writer.write(encode_frame(message))

    def _send_beats(self, up: _Upstream) -> None:
        if self._beats and not up.writer.is_closing():
            up.writer.write(encode_frame(msg.Beats(beats=list(self._beats.values()))))
            self._beats.clear()

    async def _connected(self) -> _Upstream:
        async with self._opening:
            if self.upstream is None or self.upstream.writer.is_closing():
                reader, writer = await open_peer(self.coordinator, self._secret, self.job_id, "relay")
                up = self.upstream = _Upstream(reader, writer)
                loop = asyncio.get_running_loop()
                self._tasks = [loop.create_task(self._read_upstream(up)), loop.create_task(self._beat(up))]
            return self.upstream

    async def _beat(self, up: _Upstream) -> None:
        while not up.writer.is_closing():
            await asyncio.sleep(self.beat_s)
            self._send_beats(up)

    async def _read_upstream(self, up: _Upstream) -> None:
        """Hand each message on to its worker (a pulse to every worker) until the connection ends; then every
        worker's connection ends too."""
        roster: msg.Roster | None = None
        try:
            while True:
                message = await read_message(up.reader)
                match message:
                    case msg.Relayed():
                        if (writer := self.workers.get(message.worker)) is not None:
                            writer.write(frame_of(message.frame.encode()))
                            self._answered.add(message.worker)  # the first is its registration's answer
                    case msg.RelayClosed():
                        if (writer := self.workers.get(message.worker)) is not None:
                            writer.close()
                    case msg.Pulse():
                        self.pulse(encode_frame(message))
                    case msg.Roster():
                        roster = message
                    case msg.Assigns():
                        self._assign(message, roster)
                    case _:
                        raise ProtocolError(f"the coordinator sent a node's relay {message.type!r}")
        except (ConnectionError, asyncio.IncompleteReadError, InvalidMessage, ProtocolError) as exc:
            if not isinstance(exc, ConnectionError | asyncio.IncompleteReadError):
                log.warning("control_relay_lost", reason=str(exc)[:200])
        finally:
            up.writer.close()
            for writer in list(self.workers.values()):
                writer.close()

    def pulse(self, frame: bytes) -> None:
        """The coordinator's pulse (it comes to the node's agent, which hands it on): to every worker whose
        registration was answered; before that, a worker waits for the answer, and the answer alone."""
        for wid in self._answered:
            if (writer := self.workers.get(wid)) is not None:
                writer.write(frame)

    def _assign(self, a: msg.Assigns, roster: msg.Roster | None) -> None:
        """Each member's Assign: with the whole ranks of the roster that came before, or as the change."""
        if a.since is None and (roster is None or roster.generation != a.generation):
            raise ProtocolError(f"generation {a.generation}'s assignments came without its roster")
        ranks = {"ranks": roster.ranks} if a.since is None and roster is not None else {}
        common = a.model_dump(include={"generation", "since", "left", "joined", "boundary_step", "cause"})
        for worker, rank in a.members:
            if (writer := self.workers.get(worker)) is not None:
                writer.write(encode_frame(msg.Assign(**common, **ranks, rank=rank)))

    def close(self) -> None:
        for writer in list(self.workers.values()):
            writer.close()
        if self.upstream is not None:
            self.upstream.writer.close()
        for task in self._tasks:
            task.cancel()
