"""The per-job coordinator: connections in, events to the pure reducer, its actions out.

It listens on one address; each peer and it prove the job's secret to each other before anything else
(wire.channel: small frames and a bounded number of handshakes until then). It serves the job's
rendezvous store to "store" connections (rendezvous/) and drops old generations' keys on each announce.
All state changes happen on one asyncio loop; `CoordinatorThread` runs that loop beside the launcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.coordinator.peers import Peer, PublicView, throughput
from slurm_elastic.coordinator.refusals import RefusalSummary
from slurm_elastic.decide import membership as m
from slurm_elastic.decide.failures import ExitRecord, identical_failure_verdict, never_joined_verdict, record_failure
from slurm_elastic.decide.health import Liveness, find_unresponsive, stalled_for
from slurm_elastic.errors import AuthError, HandshakeRefused, InvalidMessage, ProtocolError
from slurm_elastic.events import EventLog
from slurm_elastic.eventtypes import (
    CATALOGUED_KINDS,
    CheckpointFallback,
    CollectiveFault,
    Commit,
    ConnectionRefused,
    ControlLoopFailed,
    CoordinatorPaused,
    CoordinatorStarted,
    DrainRequested,
    GenerationReady,
    HangEvicted,
    JobFailed,
    JobFinished,
    JobSuspended,
    KeepPending,
    MembershipChange,
    MessageDropped,
    NodeLost,
    NodeRegistered,
    NodeUnresponsive,
    Progress,
    Recovered,
    RestartAll,
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
from slurm_elastic.wire.channel import HandshakeGate, accept_handshake, read_message, write_message

log = get_logger("slurm_elastic.coordinator")
TICK_S = 0.1
MAX_COMMIT_RECORDS = 10_000  # the newest commits kept for tools (MTTR, demos); events.jsonl has them all
MAX_TRACEBACKS = 100
_RESERVED_FIELDS = frozenset({"event", "job", "time", "worker", "quiet", "kind"})  # set by the coordinator
STORE_PREFIX = "rdzv"  # generation g's keys: rdzv/g<g>/...


class Coordinator:
    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        if config.events_path is not None:  # the job's directory: owner-only, never through a planted link
            private_dir(config.events_path.parent)
        self.events = EventLog(config.job_id, config.events_path)
        self.policy = m.Policy(
            expected_workers=config.expected_workers,
            min_workers=config.min_workers,
            rendezvous_timeout_s=config.rendezvous_timeout_s,
            recovery=config.recovery,
            checkpoint_fallback=config.checkpoints,
        )
        self.state = m.State()
        self.workers: dict[str, Peer] = {}
        self.agents: dict[str, Peer] = {}
        self.failures: dict[str, int] = {}
        self.tracebacks: dict[str, str] = {}
        self._view = PublicView()
        self._view_lock = threading.Lock()
        self.done = threading.Event()
        self._abrupt_since: tuple[int, float, int] | None = None  # (generation, detected at, last step)
        self._recent_commits: deque[Commit] = deque(maxlen=64)
        self._last_progress = 0.0
        self._ticker_task: asyncio.Task[None] | None = None
        self._last_tick = self._last_pulse = time.monotonic()
        self._run_offset = 0  # checkpoint fallbacks so far: each starts a new run of the ledger
        self._fallback_from: int | None = None  # the last committed step when the fallback began
        self._registered: set[str] = set()  # worker ids that ever joined
        self._agent_nproc: dict[str, int] = {}  # training processes each node's agent starts
        self.agent_registrations: Counter[str] = Counter()  # agents registered per node, over the job
        self._final_exits: list[ExitRecord] = []  # processes that ended for good before the job ran
        self.pool_keep_pending = 0  # read by the Slurm launcher, set by `grow --keep-pending`
        self.pool_partition: str | None = None
        self.drained_nodes: set[str] = set()  # every node ever asked to leave: never relaunched
        self.store = StoreService(STORE_PREFIX)
        self.gate = HandshakeGate()
        self.refusals = RefusalSummary()
        self._refusal_report: asyncio.TimerHandle | None = None
        self.server: asyncio.AbstractServer | None = None
        self.address = ""

    # --- thread-safe reads ----------------------------------------------------------------------------

    def view(self) -> PublicView:
        with self._view_lock:
            v = self._view
            return PublicView(
                v.phase,
                v.generation,
                v.world,
                v.last_step,
                v.reason,
                v.failure_traceback,
                list(v.commits),
                list(v.failed_after_training),
            )

    def _publish(self) -> None:
        gen = self.state.generation
        with self._view_lock:
            self._view.phase = self.state.phase
            self._view.generation = gen.number if gen else 0
            self._view.world = len(gen.ranks) if gen else 0
            self._view.reason = self.state.reason

    # --- start-up -------------------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        self.server = await asyncio.start_server(self._serve_connection, cfg.host, cfg.port)
        port = self.server.sockets[0].getsockname()[1]
        self.address = f"{cfg.advertise_host or cfg.host}:{port}"
        self.events.record(CoordinatorStarted(self.address, cfg.expected_workers, cfg.recovery))
        ticker = run_loudly(self._ticker(), "the coordinator's ticker", self._ticker_died)
        self._ticker_task = asyncio.get_running_loop().create_task(ticker)

    def settings(self) -> msg.WorkerSettings:
        cfg = self.config
        return msg.WorkerSettings(
            heartbeat_interval_s=cfg.heartbeat_interval_s,
            lease_timeout_s=cfg.lease_timeout_s,
            pg_timeout_s=cfg.pg_timeout_s,
            backend=cfg.backend,
            store_prefix=STORE_PREFIX,
            load_checkpoint=self.state.phase == "rendezvous",
            run=cfg.run + self._run_offset,
        )

    # --- connections ----------------------------------------------------------------------------------

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
                role = await accept_handshake(reader, writer, secret=self.config.secret, job_id=self.config.job_id)
            finally:
                self.gate.leave(writer)
            if role == "store":  # may stay quiet until its generation's group needs it
                await self.store.serve(reader, writer)
                return
            first = await asyncio.wait_for(read_message(reader), 30)
            if role == "worker" and isinstance(first, msg.Register):
                await self._serve_worker(first, reader, writer)
            elif role == "agent" and isinstance(first, msg.RegisterNode):
                await self._serve_agent(first, reader, writer)
            elif role == "client":
                await self._serve_client(first, writer)
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

    def _send(self, peer: Peer | None, message: BaseModel) -> None:
        if peer is not None and not peer.writer.is_closing():
            write_message(peer.writer, message)

    async def _serve_worker(
        self, reg: msg.Register, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        wid = reg.worker_id
        if wid in self.workers or self.state.phase in ("finished", "failed", "suspended"):
            write_message(writer, msg.Stop(reason=f"worker {wid} already registered or job over"))
            return
        now = time.monotonic()
        self.workers[wid] = Peer(writer, reg.node, now, reg.committed_step, "init", now, reg.pid)
        self._registered.add(wid)
        write_message(writer, msg.Registered(settings=self.settings()))
        self.events.record(WorkerRegistered(wid, reg.node, reg.pid, reg.committed_step))
        self._feed(m.Joined(m.Worker(wid, reg.node, reg.local_rank, reg.committed_step)))
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
                self._feed(m.Lost((wid,), "connection closed"))

    def _on_worker_message(self, wid: str, peer: Peer, message: msg.Message) -> None:
        match message:
            case msg.Heartbeat():
                if (message.step, message.phase) != (peer.step, peer.phase):
                    peer.step, peer.phase, peer.phase_since = message.step, message.phase, time.monotonic()
            case msg.Committed():
                self._on_commit(message)
            case msg.AtBoundary():
                self._feed(m.ReachedBoundary(wid, message.generation, message.step))
            case msg.CollectiveFault():
                self.events.record(CollectiveFault(wid, message.generation, message.detail))
                self._feed(m.Faulted(wid, message.generation, message.detail))
            case msg.StateLost():
                self.events.record(StateLost(wid, message.generation, message.detail))
                self._feed(m.StateLost(wid, message.generation, message.detail))
            case msg.WorkerEvent():
                self._on_worker_event(wid, message)
            case msg.Failure():
                self._on_failure(message)
            case msg.Finished():
                self._feed(m.Done(wid))
            case msg.DrainRequest():
                self._on_drain(message)
            case _:
                raise ProtocolError(f"unexpected {message.type!r} from worker {wid}")

    async def _serve_agent(
        self, reg: msg.RegisterNode, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        node = reg.node
        if node in self.agents:
            write_message(writer, msg.Stop(reason=f"node {node} already has an agent"))
            return
        self.agents[node] = Peer(writer, node, time.monotonic(), pid=reg.pid, slurm_job=reg.slurm_job_id)
        self._agent_nproc[node] = reg.nproc
        self.agent_registrations[node] += 1
        write_message(writer, msg.Ack(ok=True, detail=self.config.job_id))
        self.events.record(NodeRegistered(node, reg.host, reg.nproc, reg.slurm_job_id))
        try:
            while True:
                message = await self._next_message(reader, f"agent {node}")
                self.agents[node].last_seen = time.monotonic()
                if message is not None:
                    self._handle(self._on_agent_message, node, message)
        finally:
            if self.agents.get(node) is not None and self.agents[node].writer is writer:
                del self.agents[node]
                lost = tuple(w for w, p in self.workers.items() if p.node == node)
                if self.state.phase in ("rendezvous", "running"):
                    self.events.record(NodeLost(node, lost))
                for w in lost:
                    self._lose_worker(w, f"agent of node {node} lost")

    def _on_agent_message(self, node: str, message: msg.Message) -> None:
        match message:
            case msg.WorkerExited():
                tail = message.stderr_tail[-500:] or None
                exited = WorkerExited(message.worker_id, node, message.returncode, message.will_restart, tail)
                self.events.record(exited)
                self._on_worker_exit(node, message)
                self._lose_worker(message.worker_id, f"exited with {message.returncode}")
            case msg.DrainRequest():
                self._on_drain(message)
            case msg.Heartbeat():
                pass
            case msg.WorkerEvent(kind="control_loop_failed"):  # the agent is failing: why, before it goes
                self.events.record(ControlLoopFailed(str(message.fields.get("reason", ""))[:1000], node=node))
            case _:
                raise ProtocolError(f"unexpected {message.type!r} from agent {node}")

    def _on_worker_exit(self, node: str, e: msg.WorkerExited) -> None:
        """Exits the job must not miss: before anyone joined (a wrong command) or after training (a script
        that failed at its end)."""
        joined = e.worker_id in self._registered
        if e.returncode != 0 and e.worker_id in self.state.finished:
            with self._view_lock:
                self._view.failed_after_training.append(f"{e.worker_id} exited with {e.returncode}")
        if self.state.phase != "rendezvous" or e.will_restart:
            return
        self._final_exits.append(ExitRecord(e.worker_id, node, e.returncode, e.stderr_tail, joined))
        alive = sum(1 for w in self.workers if w != e.worker_id)
        verdict = never_joined_verdict(self._agent_nproc, self._final_exits, alive)
        if verdict is not None:
            self._feed(m.Abort(verdict))

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

    def _lose_worker(self, wid: str, cause: str) -> None:
        peer = self.workers.pop(wid, None)
        if peer is not None:
            peer.writer.close()
        self._feed(m.Lost((wid,), cause))

    async def _serve_client(self, first: msg.Message, writer: asyncio.StreamWriter) -> None:
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

    def _on_commit(self, c: msg.Committed) -> None:
        now = time.time()
        commit = Commit(c.step, c.generation, c.world, c.loss, c.time, samples=c.samples, received=now)
        self._recent_commits.append(commit)
        if self.config.record_commits:
            self.events.record(commit, quiet=True)
        with self._view_lock:
            self._view.commits.append(commit)
            if len(self._view.commits) > MAX_COMMIT_RECORDS:  # a long run must not grow the coordinator
                del self._view.commits[: len(self._view.commits) - MAX_COMMIT_RECORDS]
            self._view.last_step = max(self._view.last_step, c.step)
        if self._abrupt_since is not None and c.generation >= self._abrupt_since[0]:
            _gen, detected, before = self._abrupt_since
            self._abrupt_since = None
            took = round(time.monotonic() - detected, 4)
            self.events.record(Recovered(c.generation, c.step, detect_to_commit_s=took, last_step_before=before))
        if now - self._last_progress >= self.config.progress_interval_s:
            self._last_progress = now
            self.events.record(Progress(c.step, round(c.loss, 4), c.world, c.generation, self._throughput()))

    def _throughput(self) -> float | None:
        return throughput(list(self._recent_commits))

    def _on_worker_event(self, wid: str, e: msg.WorkerEvent) -> None:
        fields = {k: v for k, v in e.fields.items() if k not in _RESERVED_FIELDS}
        if e.kind == "generation_ready":
            last = self._view.last_step
            resume = int(fields.get("resume_step", last))
            fields["lost_committed_steps"] = max(0, last - resume)
            with self._view_lock:  # a fault between the ranks' commits of a step: rank 0 took it from a peer
                self._view.last_step = max(self._view.last_step, resume)
            if self._fallback_from is not None:  # the first generation after a checkpoint fallback
                before, self._fallback_from = self._fallback_from, None
                self.events.record(CheckpointFallback(before, resume, replayed_steps=max(0, before - resume)))
            self.events.record(GenerationReady.from_event({**fields, "worker": wid}))
        elif e.kind == ControlLoopFailed.KIND:  # the worker's control thread died: why, before it goes
            self.events.record(ControlLoopFailed(str(fields.get("reason", ""))[:1000], worker=wid))
        elif e.kind in CATALOGUED_KINDS:  # what the coordinator alone says: a worker cannot report a job_failed
            raise ProtocolError(f"a worker cannot report a {e.kind!r} event")
        else:  # a worker's own report (shard_refused, ledger_failed, checkpoint_failed, ...)
            self.events.emit(e.kind, worker=wid, **fields)

    def _on_failure(self, f: msg.Failure) -> None:
        self.failures = record_failure(self.failures, f.signature)
        if f.signature in self.tracebacks or len(self.tracebacks) < MAX_TRACEBACKS:
            self.tracebacks[f.signature] = f.traceback
        self.events.record(UserFailure(f.worker_id, f.signature, self.failures[f.signature]))
        verdict = identical_failure_verdict(self.failures, self.config.max_identical_failures)
        if verdict is not None:
            with self._view_lock:
                self._view.failure_traceback = f.traceback
            self._feed(m.Abort(verdict))

    def _on_drain(self, d: msg.DrainRequest) -> msg.Ack:
        self.drained_nodes.update(d.nodes)
        self.events.record(DrainRequested(tuple(d.nodes), d.mode, d.reason, d.source))
        if d.hold_s > 0:  # told before their workers leave, so that no agent exits first
            for node in d.nodes:
                self._send(self.agents.get(node), msg.HoldNode(hold_s=d.hold_s))
        outcome = self._feed(m.Drain(tuple(d.nodes), d.mode, d.reason))
        return msg.Ack(ok=True, detail=outcome.reason)

    # --- the reducer and its actions ------------------------------------------------------------------

    def _feed(self, event: m.Event) -> m.Outcome:
        before = self.state
        outcome = m.decide(before, event, time.monotonic(), self.policy)
        self.state = outcome.state
        for action in outcome.actions:
            self._act(action, before, event)
        self._publish()
        if self.state.phase in ("finished", "failed", "suspended"):
            self.done.set()
        return outcome

    def _act(self, action: m.Action, before: m.State, event: m.Event) -> None:
        match action:
            case m.Announce():
                self._announce(action, before, event)
            case m.Dismiss():
                for wid in action.worker_ids:
                    self._send(self.workers.get(wid), msg.Leave(reason=action.reason))
            case m.RequestBoundary():
                for wid in self.state.members:
                    self._send(self.workers.get(wid), msg.ChangePending(generation=action.generation))
            case m.RestartAll():
                gen = before.generation
                self._abrupt_since = ((gen.number if gen else 0) + 1, time.monotonic(), self._view.last_step)
                self.events.record(RestartAll(action.reason, tuple(sorted(self.agents))))
                if action.fallback:
                    self._run_offset += 1  # a new run of the ledger: the replayed steps count once
                    self._fallback_from = self._view.last_step
                for agent in self.agents.values():
                    self._send(agent, msg.RestartWorkers(reason=action.reason))
                if not self.agents:
                    self._feed(m.Abort(f"{action.reason}; but no node is left to restart on"))
            case m.Complete():
                self.events.record(JobFinished(action.reason, self._view.last_step))
                self._stop_everyone(msg.Stop(reason="complete"))
            case m.Suspend():
                self.events.record(JobSuspended(action.reason, action.step))
                self._stop_everyone(msg.Stop(reason="suspended"))
            case m.Fail():
                self.events.record(JobFailed(action.reason))
                self._stop_everyone(msg.Stop(reason="failed", error=action.reason))

    def _announce(self, a: m.Announce, before: m.State, event: m.Event) -> None:
        gen = a.generation
        self._registered.clear()  # the job runs: only exits before the next rendezvous matter again
        self._final_exits.clear()
        self.store.prune(gen.number)  # the older generations' groups are formed or abandoned: drop their keys
        for rank, wid in enumerate(gen.ranks):
            self._send(
                self.workers.get(wid),
                msg.Assign(
                    generation=gen.number,
                    rank=rank,
                    ranks=list(gen.ranks),
                    boundary_step=gen.boundary_step,
                    cause=gen.cause,
                ),
            )
        for wid in a.leaving:
            self._send(self.workers.get(wid), msg.Leave(reason=f"left in generation {gen.number}: {gen.cause}"))
        old = before.generation
        if gen.boundary_step is None and old is not None and self._abrupt_since is None:
            self._abrupt_since = (gen.number, time.monotonic(), self._view.last_step)
        change = MembershipChange(
            generation=gen.number,
            cause=gen.cause,
            world_before=len(old.ranks) if old else 0,
            world=len(gen.ranks),
            ranks=tuple(gen.ranks),
            joined=tuple(a.joined),
            left=tuple(a.left),
            boundary_step=gen.boundary_step,
            trigger=type(event).__name__,
        )
        self.events.record(change)

    def _stop_everyone(self, stop: msg.Stop) -> None:
        for peer in (*self.workers.values(), *self.agents.values()):
            self._send(peer, stop)

    # --- time -----------------------------------------------------------------------------------------

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self._tick(time.monotonic())

    def _ticker_died(self, reason: str) -> None:
        """Without its ticker the coordinator sends no pulses and detects nothing: fail the job now, saying
        why, rather than let every agent find it silent a lease later."""
        self.events.record(ControlLoopFailed(reason, loop="ticker"))
        self.fail(reason)

    def fail(self, reason: str) -> None:
        """Fail the job with `reason` (on the coordinator's loop): every agent and worker is stopped with it."""
        try:
            self._feed(m.Abort(reason))
        except Exception:  # the reducer itself is what broke: stop everyone by hand
            self.state = replace(self.state, phase="failed", reason=reason)
            self._publish()
            self.done.set()
            self.events.record(JobFailed(reason))
            self._stop_everyone(msg.Stop(reason="failed", error=reason))

    def _tick(self, now: float) -> None:
        cfg = self.config
        stalled = stalled_for(self._last_tick, now, TICK_S)
        self._last_tick = now
        if stalled:  # this process was stopped: nobody else's silence in that time counts against them
            for held in (*self.workers.values(), *self.agents.values()):
                held.last_seen += stalled
                held.phase_since += stalled
            self.events.record(CoordinatorPaused(round(stalled, 2)))
        if now - self._last_pulse >= cfg.heartbeat_interval_s:
            self._last_pulse = now
            pulse = msg.Pulse(generation=self.state.generation.number if self.state.generation else 0)
            for client in (*self.workers.values(), *self.agents.values()):
                self._send(client, pulse)
        self._feed(m.Tick())
        if self.state.phase != "running":
            return
        members = [
            Liveness(w, p.last_seen, p.step, p.phase, p.phase_since)
            for w in self.state.members
            if (p := self.workers.get(w)) is not None and w not in self.state.finished
        ]
        agents = [Liveness(n, p.last_seen, 0, "agent", p.last_seen) for n, p in self.agents.items()]
        lease, hang = cfg.lease_timeout_s, cfg.hang_timeout_s
        for verdict in find_unresponsive(now, agents, lease_timeout_s=lease, hang_timeout_s=hang):
            self.events.record(NodeUnresponsive(verdict.worker_id, verdict.reason))
            agent = self.agents.pop(verdict.worker_id)
            agent.writer.close()
            for w in [w for w, p in self.workers.items() if p.node == verdict.worker_id]:
                self._lose_worker(w, f"node {verdict.worker_id} unresponsive")
        for verdict in find_unresponsive(now, members, lease_timeout_s=lease, hang_timeout_s=hang):
            peer = self.workers.get(verdict.worker_id)
            if peer is None:
                continue
            self.events.record(HangEvicted(verdict.worker_id, verdict.cause, verdict.reason))
            self._send(self.agents.get(peer.node), msg.KillWorker(worker_id=verdict.worker_id, reason=verdict.reason))
            self._lose_worker(verdict.worker_id, f"{verdict.cause}: {verdict.reason}")

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
        last = self._recent_commits[-1] if self._recent_commits else None
        return msg.StatusReply(
            job_id=self.config.job_id,
            state=self.state.phase,
            generation=gen.number if gen else 0,
            world_size=len(gen.ranks) if gen else 0,
            step=last.step if last else 0,
            loss=last.loss if last else None,
            samples_per_s=self._throughput(),
            nodes=sorted(self.agents),
            node_jobs={n: p.slurm_job for n, p in sorted(self.agents.items())},
            members=members,
            pending=list(self.state.joiners),
            draining=sorted(self.state.draining),
            events=self.events.recent(20),
        )
