"""The per-job coordinator: peers' messages and their silence become events of the membership reducer.

Its parts: `connections` (the door: listening, the secret proven both ways, peers handed on by role),
`driver` (the reducer's driver: events in, messages and job events out), `ticker` (pulses, leases, hangs),
`record` (what other threads and tools read: the public view, commits, progress, recovery times),
`reachability` (probe rounds after a collective fault: cuts between nodes that still reach it),
`scripts` (what workers report of their scripts), the rendezvous store (served to "store" connections).
This module serves the peers' connections and turns what they send into the driver's events. All state
changes happen on one asyncio loop; `CoordinatorThread` runs that loop beside the launcher.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Container
from typing import Any

from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.coordinator.connections import Connections, allow_open_files
from slurm_elastic.coordinator.driver import STORE_PREFIX, Driver, send
from slurm_elastic.coordinator.peers import Peer, PeerWriter, PublicView
from slurm_elastic.coordinator.reachability import Reachability
from slurm_elastic.coordinator.record import Record
from slurm_elastic.coordinator.relayed import serve_relay
from slurm_elastic.coordinator.scripts import ScriptReports
from slurm_elastic.coordinator.ticker import Ticker
from slurm_elastic.decide import membership as m
from slurm_elastic.decide.failures import ExitRecord
from slurm_elastic.decide.loops import LoopSettings, step_taken
from slurm_elastic.errors import InvalidMessage, ProtocolError
from slurm_elastic.events import EventLog
from slurm_elastic.eventtypes import (
    CATALOGUED_KINDS,
    CollectiveFault,
    ControlLoopFailed,
    CoordinatorStarted,
    DrainRequested,
    KeepPending,
    MessageDropped,
    NodeLost,
    NodeRegistered,
    StateLost,
    UserFailure,
    WorkerExited,
    WorkerRegistered,
)
from slurm_elastic.jobdir import private_dir
from slurm_elastic.logs import get_logger
from slurm_elastic.loops import run_loudly
from slurm_elastic.rendezvous.service import StoreService
from slurm_elastic.wire import messages as msg
from slurm_elastic.wire.channel import read_message, write_message

log = get_logger("slurm_elastic.coordinator")
_RESERVED_FIELDS = frozenset({"event", "job", "time", "worker", "quiet", "kind"})  # set by the coordinator


class Coordinator:
    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        if config.events_path is not None:  # the job's directory: owner-only, never through a planted link
            private_dir(config.events_path.parent)
        self.events = EventLog(config.job_id, config.events_path)
        self.workers: dict[str, Peer] = {}
        self.agents: dict[str, Peer] = {}
        self.relays: set[asyncio.StreamWriter] = set()  # the nodes' control relays' connections
        self.scripts = ScriptReports(config.max_identical_failures)
        self.record = Record(
            self.events, record_commits=config.record_commits, progress_interval_s=config.progress_interval_s
        )
        self.store = StoreService(STORE_PREFIX)
        self.driver = Driver(config, self.events, self.record, self.scripts, self.store, self.workers, self.agents)
        self.reachability = Reachability(self.events, self.driver)
        self.ticker = Ticker(config, self.events, self.driver, self.reachability)
        self._ticker_task: asyncio.Task[None] | None = None
        self._agent_nproc: dict[str, int] = {}  # training processes each node's agent starts
        self.agent_registrations: Counter[str] = Counter()  # agents registered per node, over the job
        self.pool_keep_pending = 0  # read by the Slurm launcher, set by `grow --keep-pending`
        self.pool_partition: str | None = None
        self.drained_nodes: set[str] = set()  # every node ever asked to leave: never relaunched
        self.connections = Connections(config, self.events, self.store, self)

    @property
    def state(self) -> m.State:
        return self.driver.state

    @property
    def done(self) -> threading.Event:
        return self.driver.done

    def cancel(self, reason: str) -> None:
        self.driver.cancel(reason)

    def fail(self, reason: str) -> None:
        """Fail the job with `reason` (on the coordinator's loop): every agent and worker is stopped with it."""
        self.driver.fail(reason)

    @property
    def address(self) -> str:
        return self.connections.address

    def report_refusals(self) -> None:
        self.connections.report_refusals()

    def view(self) -> PublicView:
        """The job's public view (safe from any thread)."""
        return self.record.view()

    # --- start-up -------------------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        allow_open_files(3 * cfg.expected_workers + 64)  # each worker: control + store; each node: an agent
        await self.connections.listen()
        self.events.record(CoordinatorStarted(self.address, cfg.expected_workers, cfg.recovery))
        ticker = run_loudly(self.ticker.run(), "the coordinator's ticker", self.ticker.died)
        self._ticker_task = asyncio.get_running_loop().create_task(ticker)

    # --- peers ---------------------------------------------------------------------------------------

    async def serve_worker(self, reg: msg.Register, reader: asyncio.StreamReader, writer: PeerWriter) -> None:
        wid = reg.worker_id
        if wid in self.workers or self.driver.over:
            write_message(writer, msg.Stop(reason=f"worker {wid} already registered or job over"))
            return
        now = time.monotonic()
        self.workers[wid] = Peer(writer, reg.node, now, reg.committed_step, "init", now, reg.pid)
        self.scripts.registered(wid)
        write_message(writer, msg.Registered(settings=self.driver.settings()))
        self.events.record(WorkerRegistered(wid, reg.node, reg.pid, reg.committed_step))
        joined = m.Joined(m.Worker(wid, reg.node, reg.local_rank, reg.committed_step))
        if not self.reachability.hold(joined):
            self.driver.feed(joined)
        try:
            while True:
                message = await self._next_message(reader, wid)
                peer = self.workers.get(wid)
                if peer is None:
                    return
                peer.last_seen = time.monotonic()
                if message is not None:
                    self._handle(self._on_worker_message, wid, peer, message)
        finally:
            if self.workers.get(wid) is not None and self.workers[wid].writer is writer:
                del self.workers[wid]
                self.reachability.worker_gone(wid)
                self.driver.lost(wid, "connection closed")

    def _on_worker_message(self, wid: str, peer: Peer, message: msg.Message) -> None:
        match message:
            case msg.Heartbeat():
                peer.generation = message.generation
                if (message.step, message.phase) != (peer.step, peer.phase):
                    self._moved(wid, peer, message.step, message.phase)
            case msg.Committed():
                self.record.commit(message)
            case msg.AtBoundary():
                self.driver.feed(m.ReachedBoundary(wid, message.generation, message.step))
            case msg.CollectiveFault():
                self.events.record(CollectiveFault(wid, message.generation, message.detail))
                self.reachability.fault(m.Faulted(wid, message.generation, message.detail))
            case msg.StateLost():
                self.events.record(StateLost(wid, message.generation, message.detail))
                self.driver.feed(m.StateLost(wid, message.generation, message.detail))
            case msg.WorkerEvent():
                self._on_worker_event(wid, message)
            case msg.Failure():
                self._on_failure(message)
            case msg.Finished():
                first = not self.state.ended
                self.driver.feed(m.Done(wid, message.generation, message.step, message.how))
                if first and self.state.ended:  # from now on, a member running past that step is an error
                    for w in self.state.members:
                        if (other := self.workers.get(w)) is not None:
                            self._check_went_on(w, other)
            case msg.StopAsked():
                self.driver.feed(m.StopAsked(wid, message.reason))
            case msg.LoopOpened():
                self._on_loop_opened(wid, message.settings)
            case msg.DrainRequest():
                self._on_drain(message)
            case _:
                raise ProtocolError(f"unexpected {message.type!r} from worker {wid}")

    def _moved(self, wid: str, peer: Peer, step: int, phase: msg.Phase) -> None:
        """A worker's heartbeat shows it at a new step or phase."""
        peer.step, peer.phase, peer.phase_since = step, phase, time.monotonic()
        if self.state.ended:
            self._check_went_on(wid, peer)

    async def serve_relay(self, first: msg.Message, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A node's control relay: its workers, each served as `serve_worker` serves a direct one."""
        self.relays.add(writer)
        try:
            await serve_relay(first, reader, writer, self.serve_worker, self._on_beats, self.events)
        finally:
            self.relays.discard(writer)

    def _on_beats(self, beats: list[msg.Beat], relayed: Container[str]) -> None:
        """A relay's frame of its workers' heartbeats: thousands a second at scale, so the common case (alive,
        nothing new) costs a lookup and two stores."""
        now = time.monotonic()
        for wid, generation, step, phase in beats:
            if wid in relayed and (peer := self.workers.get(wid)) is not None:
                peer.last_seen, peer.generation = now, generation
                if (step, phase) != (peer.step, peer.phase):
                    self._handle(self._moved, wid, peer, step, phase)

    def _check_went_on(self, wid: str, peer: Peer) -> None:
        """A member whose heartbeat shows it past the step where another member's loop ended."""
        end = next(iter(self.state.ended.values()), None)
        taken = step_taken(peer.step, peer.phase)
        if end is not None and taken > end.step and self.state.phase == "running":
            self.driver.feed(m.WentOn(wid, peer.generation, taken))

    def _on_loop_opened(self, wid: str, settings: LoopSettings) -> None:
        if (difference := self.scripts.loop_opened(wid, settings)) is not None:
            self.driver.feed(m.Abort(difference))

    async def serve_agent(
        self, reg: msg.RegisterNode, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        node = reg.node
        if node in self.agents:
            write_message(writer, msg.Stop(reason=f"node {node} already has an agent"))
            return
        self.agents[node] = Peer(
            writer, node, time.monotonic(), pid=reg.pid, slurm_job=reg.slurm_job_id, interface=reg.interface
        )
        self._agent_nproc[node] = reg.nproc
        self.reachability.agent_registered(node, reg.probe)
        self.agent_registrations[node] += 1
        write_message(writer, msg.Ack(ok=True, detail=self.config.job_id))
        self.events.record(NodeRegistered(node, reg.host, reg.nproc, reg.slurm_job_id, reg.interface))
        try:
            while True:
                message = await self._next_message(reader, f"agent {node}")
                self.agents[node].last_seen = time.monotonic()
                if message is not None:
                    self._handle(self._on_agent_message, node, message)
        finally:
            if self.agents.get(node) is not None and self.agents[node].writer is writer:
                del self.agents[node]
                self.reachability.agent_lost(node)
                lost = tuple(w for w, p in self.workers.items() if p.node == node)
                if self.state.phase in ("rendezvous", "running"):
                    self.events.record(NodeLost(node, lost))
                for w in lost:
                    self.driver.lose(w, f"agent of node {node} lost")

    def _on_agent_message(self, node: str, message: msg.Message) -> None:
        match message:
            case msg.WorkerExited():
                tail = message.stderr_tail[-500:] or None
                exited = WorkerExited(message.worker_id, node, message.returncode, message.will_restart, tail)
                self.events.record(exited)
                self._on_worker_exit(node, message)
                self.driver.lose(message.worker_id, f"exited with {message.returncode}")
            case msg.DrainRequest():
                self._on_drain(message)
            case msg.Heartbeat():
                pass
            case msg.ProbeResult():
                self.reachability.result(node, message)
            case msg.WorkerEvent(kind="control_loop_failed"):  # the agent is failing: why, before it goes
                self.events.record(ControlLoopFailed(str(message.fields.get("reason", ""))[:1000], node=node))
            case _:
                raise ProtocolError(f"unexpected {message.type!r} from agent {node}")

    def _on_worker_exit(self, node: str, e: msg.WorkerExited) -> None:
        """Exits the job must not miss: before anyone joined (a wrong command) or after training (a script
        that failed at its end)."""
        joined = self.scripts.joined(e.worker_id)
        if e.returncode != 0 and e.worker_id in self.state.ended:
            self.record.failed_after_training(f"{e.worker_id} exited with {e.returncode}")
        if self.state.phase != "rendezvous":
            return
        exit_ = ExitRecord(e.worker_id, node, e.returncode, e.stderr_tail, joined, final=not e.will_restart)
        alive = sum(1 for w in self.workers if w != e.worker_id)
        verdict = self.scripts.exited_early(exit_, self._agent_nproc, alive)
        if verdict is not None:
            told = self.scripts.first_words()
            if told is not None:
                self.record.failed(told)  # the first failure's whole traceback, printed by the launcher
            self.driver.feed(m.Abort(verdict))

    async def _next_message(self, reader: asyncio.StreamReader, sender: str) -> msg.Message | None:
        """The next message, or None for a whole frame that is not a valid one (dropped, with an event)."""
        try:
            return await read_message(reader)
        except InvalidMessage as exc:
            self.events.record(MessageDropped(sender, str(exc)))
            return None

    def _handle(self, act: Callable[..., None], sender: str, *args: Any) -> None:
        """Act on one authenticated message; one that cannot be acted on is dropped, never the connection."""
        try:
            act(sender, *args)
        except Exception as exc:  # a bad message must cost that message, not the worker or the coordinator
            self.events.record(MessageDropped(sender, f"{type(exc).__name__}: {exc}"[:500]))

    async def serve_client(self, first: msg.Message, writer: asyncio.StreamWriter) -> None:
        if isinstance(first, msg.StatusRequest):
            write_message(writer, self.status())
        elif isinstance(first, msg.DrainRequest):
            write_message(writer, self._on_drain(first))
        elif isinstance(first, msg.KeepPending):
            self.pool_keep_pending, self.pool_partition = first.count, first.partition
            self.events.record(KeepPending(first.count, first.partition))
            write_message(writer, msg.Ack(ok=True, detail=f"keeping {first.count} satellites pending"))
        else:
            write_message(writer, msg.Ack(ok=False, detail=f"unsupported request {first.type!r}"))
        await writer.drain()

    # --- message handlers -----------------------------------------------------------------------------

    def _on_worker_event(self, wid: str, e: msg.WorkerEvent) -> None:
        fields = {k: v for k, v in e.fields.items() if k not in _RESERVED_FIELDS}
        if e.kind == "generation_ready":
            self.record.generation_ready(wid, fields)
        elif e.kind == ControlLoopFailed.KIND:  # the worker's control thread died: why, before it goes
            self.events.record(ControlLoopFailed(str(fields.get("reason", ""))[:1000], worker=wid))
        elif e.kind in CATALOGUED_KINDS:  # what the coordinator alone says: a worker cannot report a job_failed
            raise ProtocolError(f"a worker cannot report a {e.kind!r} event")
        else:  # a worker's own report (shard_refused, ledger_failed, checkpoint_failed, ...)
            self.events.emit(e.kind, worker=wid, **fields)

    def _on_failure(self, f: msg.Failure) -> None:
        verdict = self.scripts.failed(f)
        self.events.record(UserFailure(f.worker_id, f.signature, self.scripts.failures[f.signature]))
        if verdict is not None:
            self.record.failed(f.traceback)
            self.driver.feed(m.Abort(verdict))

    def _on_drain(self, d: msg.DrainRequest) -> msg.Ack:
        self.drained_nodes.update(d.nodes)
        self.events.record(DrainRequested(tuple(d.nodes), d.mode, d.reason, d.source))
        if d.hold_s > 0:  # told before their workers leave, so that no agent exits first
            for node in d.nodes:
                send(self.agents.get(node), msg.HoldNode(hold_s=d.hold_s))
        outcome = self.driver.feed(m.Drain(tuple(d.nodes), d.mode, d.reason))
        return msg.Ack(ok=True, detail=outcome.reason)

    # --- status ---------------------------------------------------------------------------------------

    def status(self) -> msg.StatusReply:
        gen = self.state.generation
        now = time.monotonic()
        ranks = {w: i for i, w in enumerate(gen.ranks)} if gen else {}
        members = [
            msg.MemberStatus(
                worker_id=w,
                node=p.node,
                rank=ranks.get(w),
                step=p.step,
                phase=p.phase,
                last_seen_s=round(now - p.last_seen, 2),
            )
            for w, p in sorted(self.workers.items(), key=lambda kv: (ranks.get(kv[0], 1 << 30), kv[0]))
        ]
        last = self.record.last_commit
        return msg.StatusReply(
            job_id=self.config.job_id,
            state=self.state.phase,
            generation=gen.number if gen else 0,
            world_size=len(gen.ranks) if gen else 0,
            step=last.step if last else 0,
            loss=last.loss if last else None,
            samples_per_s=self.record.throughput(),
            nodes=sorted(self.agents),
            node_jobs={n: p.slurm_job for n, p in sorted(self.agents.items())},
            node_interfaces={n: p.interface for n, p in sorted(self.agents.items())},
            members=members,
            pending=list(self.state.joiners),
            draining=sorted(self.state.draining),
            held={w: j.worker.node for w, j in sorted(self.reachability.held.items())},
            events=self.events.recent(20),
        )
