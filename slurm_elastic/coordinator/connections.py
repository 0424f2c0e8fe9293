"""The coordinator's door: its listening socket, each connection's handshake (the job's secret, proven both
ways, a bounded number of handshakes at a time), the refused ones summed up, and each authenticated peer
handed on by its role: store clients to the store service, workers, agents, node relays and clients to the
coordinator."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from typing import Protocol

from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.coordinator.refusals import RefusalSummary
from slurm_elastic.errors import AuthError, HandshakeRefused, ProtocolError
from slurm_elastic.events import EventLog
from slurm_elastic.eventtypes import ConnectionRefused, ControlLoopFailed
from slurm_elastic.logs import get_logger
from slurm_elastic.loops import run_loudly
from slurm_elastic.rendezvous.service import StoreService
from slurm_elastic.wire import messages as msg
from slurm_elastic.wire.channel import HandshakeGate, accept_handshake, read_message

log = get_logger("slurm_elastic.coordinator")
Reader, Writer = asyncio.StreamReader, asyncio.StreamWriter


class Peers(Protocol):
    """What serves an authenticated worker, agent or client from its first message on (the coordinator)."""

    async def serve_worker(
        self, reg: msg.Register, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None: ...

    async def serve_relay(
        self, first: msg.Message, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None: ...

    async def serve_agent(
        self, reg: msg.RegisterNode, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None: ...

    async def serve_client(self, first: msg.Message, writer: asyncio.StreamWriter) -> None: ...


def allow_open_files(wanted: int) -> int:
    """Raise this process's soft limit on open files to its hard limit (often 1,024 against 500,000): the
    coordinator holds a connection per agent, worker and store client. Warns when even that is short."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if 0 <= soft < wanted:
        log.warning("open_files_short", limit=soft, wanted=wanted, fix="raise the hard limit (LimitNOFILE, ulimit -Hn)")
    return soft


class Connections:
    def __init__(self, config: CoordinatorConfig, events: EventLog, store: StoreService, peers: Peers) -> None:
        self._config = config
        self.events = events
        self.store = store
        self.peers = peers
        self.gate = HandshakeGate()
        self.refusals = RefusalSummary()
        self._refusal_report: asyncio.TimerHandle | None = None
        self.server: asyncio.AbstractServer | None = None
        self.address = ""

    async def listen(self) -> None:
        cfg = self._config
        self.server = await asyncio.start_server(self._serve_connection, cfg.host, cfg.port)
        port = self.server.sockets[0].getsockname()[1]
        self.address = f"{cfg.advertise_host or cfg.host}:{port}"

    def close(self) -> None:
        """Stop listening and drop every connection still in its handshake."""
        if self.server is not None:
            self.server.close()
        self.gate.abort_all()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str(writer.get_extra_info("peername"))
        await run_loudly(self._on_connect(reader, writer), f"the connection task of {peer}", self._connection_died)

    def _connection_died(self, reason: str) -> None:
        """One connection's task failed: that peer is lost the ordinary way (its connection closes), and the
        reason is on record. Not the job: one peer's connection, authenticated or not, must not stop it."""
        self.events.record(ControlLoopFailed(reason, loop="connection"))

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self.gate.enter(writer)
            try:
                role = await accept_handshake(reader, writer, secret=self._config.secret, job_id=self._config.job_id)
            finally:
                self.gate.leave(writer)
            if role == "store":  # may stay quiet until its generation's group needs it
                await self.store.serve(reader, writer)
                return
            first = await asyncio.wait_for(read_message(reader), 30)
            if role == "worker" and isinstance(first, msg.Register):
                await self.peers.serve_worker(first, reader, writer)
            elif role == "agent" and isinstance(first, msg.RegisterNode):
                await self.peers.serve_agent(first, reader, writer)
            elif role == "relay":
                await self.peers.serve_relay(first, reader, writer)
            elif role == "client":
                await self.peers.serve_client(first, writer)
            else:
                raise ProtocolError(f"a {role} may not open with {first.type!r}")
        except HandshakeRefused as exc:  # a peer without the secret: counted, never quoted
            self._refused(exc.category, writer)
        except (AuthError, ProtocolError) as exc:  # an authenticated peer's mistake
            self.events.record(ConnectionRefused(str(exc)[:500], str(writer.get_extra_info("peername"))))
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _refused(self, category: str, writer: asyncio.StreamWriter) -> None:
        """One refused handshake: reported at once after a quiet spell, else summed up once an interval."""
        peername = writer.get_extra_info("peername")  # the kernel's record of the peer's address
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else "unknown"
        summary = self.refusals.note(category, peer, time.monotonic())
        if summary is not None:
            self.events.emit("handshakes_refused", **summary)
        elif self._refusal_report is None and (due := self.refusals.due()) is not None:
            delay = max(0.0, due - time.monotonic())
            self._refusal_report = asyncio.get_running_loop().call_later(delay, self.report_refusals)

    def report_refusals(self) -> None:
        """Emit the refusals not yet reported (at the end of their interval, or when the coordinator stops)."""
        if self._refusal_report is not None:
            self._refusal_report.cancel()
            self._refusal_report = None
        summary = self.refusals.take(time.monotonic())
        if summary is not None:
            self.events.emit("handshakes_refused", **summary)
