"""The per-job coordinator: the driver of the pure reducer (decide.membership). Peers' messages and their
silence become its events; its actions become messages to peers.

Its parts: `connections` (the door: listening, the secret proven both ways, peers handed on by role),
`record` (what other threads and tools read: the public view, commits, progress, recovery times), the
rendezvous store (served to "store" connections; old generations' keys dropped on each announce). It keeps
the peers' connections, their liveness, and the job's membership. All state changes happen on one asyncio
loop; `CoordinatorThread` runs that loop beside the launcher.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.coordinator.connections import Connections, allow_open_files
from slurm_elastic.coordinator.peers import Peer, PublicView
from slurm_elastic.coordinator.record import Record
from slurm_elastic.coordinator.scripts import ScriptReports
from slurm_elastic.decide import membership as m
from slurm_elastic.decide.failures import ExitRecord
from slurm_elastic.decide.health import Liveness, find_unresponsive, stalled_for
from slurm_elastic.decide.loops import LoopSettings, step_running
from slurm_elastic.errors import InvalidMessage, ProtocolError
from slurm_elastic.events import EventLog
from slurm_elastic.eventtypes import (
    CATALOGUED_KINDS,
    CheckpointFallback,
    CollectiveFault,
    ControlLoopFailed,
    CoordinatorPaused,
    CoordinatorStarted,
    DrainRequested,
    GenerationReady,
    HangEvicted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobSuspended,
    KeepPending,
    MembershipChange,
    MessageDropped,
    NodeLost,
    NodeRegistered,
    NodeUnresponsive,
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
from slurm_elastic.wire.channel import encode_frame, read_message, write_message

log = get_logger("slurm_elastic.coordinator")
TICK_S = 0.1
LIVENESS_S = 0.5  # leases and hangs are judged this often: a scan is O(peers), the lease is seconds long
_RESERVED_FIELDS = frozenset({"event", "job", "time", "worker", "quiet", "kind"})  # set by the coordinator
STORE_PREFIX = "rdzv"  # generation g's keys: rdzv/g<g>/...


def ranks_change(old: m.Generation, new: m.Generation) -> dict[str, Any] | None:
    """`new`'s ranks as an Assign's change since `old` (left taken out, joined appended), or None where the
    survivors were reordered and only the whole list says it."""
    kept = set(new.ranks)
    survivors = tuple(w for w in old.ranks if w in kept)
    if new.ranks[: len(survivors)] != survivors:
        return None
    left = [w for w in old.ranks if w not in kept]
    return {"since": old.number, "left": left, "joined": list(new.ranks[len(survivors) :])}


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
        self._losses: dict[str, str] = {}  # workers lost in this turn of the loop, and why (see _lost)
        self.scripts = ScriptReports(config.max_identical_failures)
        self._cancelled = False  # stopped by the person who started it: what follows is not the job's doing
        self.record = Record(
            self.events, record_commits=config.record_commits, progress_interval_s=config.progress_interval_s
        )
        self.done = threading.Event()
        self._ticker_task: asyncio.Task[None] | None = None
        self._last_tick = self._last_pulse = self._last_scan = time.monotonic()
        self._last_tick_cpu = 0.0  # the loop thread's CPU time at the last tick (set on the loop's thread)
        self._run_offset = 0  # checkpoint fallbacks so far: each starts a new run of the ledger
        self._fallback_from: int | None = None  # the last committed step when the fallback began
        self._registered: set[str] = set()  # worker ids that ever joined
        self._agent_nproc: dict[str, int] = {}  # training processes each node's agent starts
        self.agent_registrations: Counter[str] = Counter()  # agents registered per node, over the job
        self.pool_keep_pending = 0  # read by the Slurm launcher, set by `grow --keep-pending`
        self.pool_partition: str | None = None
        self.drained_nodes: set[str] = set()  # every node ever asked to leave: never relaunched
        self.store = StoreService(STORE_PREFIX)
        self.connections = Connections(config, self.events, self.store, self)

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

    # --- peers ---------------------------------------------------------------------------------------

    def _send(self, peer: Peer | None, message: BaseModel) -> None:
        if peer is not None and not peer.writer.is_closing():
            write_message(peer.writer, message)

    async def serve_worker(self, reg: msg.Register, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
                self._lost(wid, "connection closed")

    def _on_worker_message(self, wid: str, peer: Peer, message: msg.Message) -> None:
        match message:
            case msg.Heartbeat():
                peer.generation = message.generation
                if (message.step, message.phase) != (peer.step, peer.phase):
                    peer.step, peer.phase, peer.phase_since = message.step, message.phase, time.monotonic()
                    if self.state.ended:
                        self._check_went_on(wid, peer)
            case msg.Committed():
                self.record.commit(message)
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
                first = not self.state.ended
                self._feed(m.Done(wid, message.generation, message.step, message.how))
                if first and self.state.ended:  # from now on, a member running past that step is an error
                    for w in self.state.members:
                        if (other := self.workers.get(w)) is not None:
                            self._check_went_on(w, other)
            case msg.StopAsked():
                self._feed(m.StopAsked(wid, message.reason))
            case msg.LoopOpened():
                self._on_loop_opened(wid, message.settings)
            case msg.DrainRequest():
                self._on_drain(message)
            case _:
                raise ProtocolError(f"unexpected {message.type!r} from worker {wid}")

    def _check_went_on(self, wid: str, peer: Peer) -> None:
        """A member whose heartbeat shows it past the step where another member's loop ended."""
        end = next(iter(self.state.ended.values()), None)
        running = step_running(peer.step, peer.phase)
        if end is not None and running > end.step and self.state.phase == "running":
            self._feed(m.WentOn(wid, peer.generation, running))

    def _on_loop_opened(self, wid: str, settings: LoopSettings) -> None:
        if (difference := self.scripts.loop_opened(wid, settings)) is not None:
            self._feed(m.Abort(difference))

    async def serve_agent(
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
        self._lost(wid, cause)

    def _lost(self, wid: str, cause: str) -> None:
        """`wid` is gone: the reducer hears of it at the end of this turn of the loop, with every other loss
        of the same turn. A node's connections (or a rack's) close together; one generation answers them all,
        not one per connection, each announced to every member (O(N^2) frames for a rack at 4,096 nodes)."""
        if not self._losses:
            asyncio.get_running_loop().call_soon(self._report_losses)
        self._losses.setdefault(wid, self.scripts.cause_of_loss(wid, cause))

    def _report_losses(self) -> None:
        losses, self._losses = self._losses, {}
        causes = list(dict.fromkeys(losses.values()))
        cause = "; ".join(causes[:3]) + (f"; and {len(causes) - 3} more" if len(causes) > 3 else "")
        self._feed(m.Lost(tuple(losses), cause))

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
            resume = int(fields.get("resume_step", self.record.last_step))
            fields["lost_committed_steps"] = self.record.resumed_at(resume)
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
        verdict = self.scripts.failed(f)
        self.events.record(UserFailure(f.worker_id, f.signature, self.scripts.failures[f.signature]))
        if verdict is not None:
            self.record.failed(f.traceback)
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

    def cancel(self, reason: str) -> None:
        """The launcher is stopping the job on its user's word (Ctrl-C): say so, once, and take the losses of
        the processes it then ends for what they are, not for a failure of the job."""
        if self._cancelled or self.state.phase in ("finished", "failed", "suspended"):
            return
        self._cancelled = True
        self.events.record(JobCancelled(reason, self.record.last_step))
        self.done.set()

    def _feed(self, event: m.Event) -> m.Outcome:
        if self._cancelled:
            return m.Outcome(self.state, (), "the job was cancelled")
        before = self.state
        outcome = m.decide(before, event, time.monotonic(), self.policy)
        self.state = outcome.state
        for action in outcome.actions:
            self._act(action, before, event)
        self.record.publish(self.state)
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
                self.record.recovery_began((gen.number if gen else 0) + 1)
                self.scripts.scripts_restarted()
                self.events.record(RestartAll(action.reason, tuple(sorted(self.agents))))
                if action.fallback:
                    self._run_offset += 1  # a new run of the ledger: the replayed steps count once
                    self._fallback_from = self.record.last_step
                for agent in self.agents.values():
                    self._send(agent, msg.RestartWorkers(reason=action.reason))
                if not self.agents:
                    self._feed(m.Abort(f"{action.reason}; but no node is left to restart on"))
            case m.Complete():
                self.events.record(JobFinished(action.reason, self.record.last_step))
                self._stop_everyone(msg.Stop(reason="complete"))
            case m.Suspend():
                self.events.record(JobSuspended(action.reason, action.step))
                self._stop_everyone(msg.Stop(reason="suspended"))
            case m.Fail():
                shown = self.scripts.last_traceback  # the members were lost to their script's exception
                if shown is not None and self.record.view().failure_traceback is None:
                    self.record.failed(shown)
                self.events.record(JobFailed(action.reason))
                self._stop_everyone(msg.Stop(reason="failed", error=action.reason))

    def _announce(self, a: m.Announce, before: m.State, event: m.Event) -> None:
        gen = a.generation
        self._registered.clear()  # the job runs: only exits before the next rendezvous matter again
        self.scripts.generation_formed()
        self.store.prune(gen.number)  # the older generations' groups are formed or abandoned: drop their keys
        old = before.generation
        diff = ranks_change(old, gen) if old is not None else None
        whole = {"ranks": list(gen.ranks)}
        for rank, wid in enumerate(gen.ranks):
            peer = self.workers.get(wid)
            if peer is None:
                continue
            ranks = diff if diff is not None and old is not None and peer.assigned == old.number else whole
            peer.assigned = gen.number
            at = {"generation": gen.number, "rank": rank, "boundary_step": gen.boundary_step, "cause": gen.cause}
            self._send(peer, msg.Assign(**at, **ranks))
        for wid in a.leaving:
            self._send(self.workers.get(wid), msg.Leave(reason=f"left in generation {gen.number}: {gen.cause}"))
        if gen.boundary_step is None and old is not None:
            self.record.recovery_began(gen.number, unless_begun=True)
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
        self._last_tick_cpu = time.thread_time()
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
            self.record.publish(self.state)
            self.done.set()
            self.events.record(JobFailed(reason))
            self._stop_everyone(msg.Stop(reason="failed", error=reason))

    def _tick(self, now: float) -> None:
        cfg = self.config
        cpu = time.thread_time()  # the loop's own thread: busy is slow, not stopped
        stalled = stalled_for(self._last_tick, now, TICK_S, busy_s=cpu - self._last_tick_cpu)
        self._last_tick, self._last_tick_cpu = now, cpu
        if stalled:  # this process was stopped: nobody else's silence in that time counts against them
            for held in (*self.workers.values(), *self.agents.values()):
                held.last_seen += stalled
                held.phase_since += stalled
            self.events.record(CoordinatorPaused(round(stalled, 2)))
        if now - self._last_pulse >= cfg.heartbeat_interval_s:
            self._last_pulse = now
            pulse = encode_frame(msg.Pulse(generation=self.state.generation.number if self.state.generation else 0))
            for client in (*self.workers.values(), *self.agents.values()):
                if not client.writer.is_closing():
                    client.writer.write(pulse)
        self._feed(m.Tick())
        if self.state.phase != "running" or now - self._last_scan < LIVENESS_S:
            return
        self._last_scan = now
        agents, members = self._suspects(now)
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

    def _suspects(self, now: float) -> tuple[list[Liveness], list[Liveness]]:
        """The agents and members that may be silent or hung, as `find_unresponsive` needs them (with every
        member waiting in a reduction where one may be hung). Only suspects become records: reading two
        numbers of every peer is cheap; a record for each, twice a second at 4,096 nodes, was not."""
        cfg = self.config
        lease_cut, hang_cut = now - cfg.lease_timeout_s, now - cfg.hang_timeout_s
        agents = [
            Liveness(n, p.last_seen, 0, "agent", p.last_seen) for n, p in self.agents.items() if p.last_seen < lease_cut
        ]
        ended = self.state.ended
        peers = [(w, p) for w in self.state.members if (p := self.workers.get(w)) is not None and w not in ended]
        hung = any(p.phase == "compute" and p.phase_since < hang_cut for _, p in peers)
        members = [
            Liveness(w, p.last_seen, p.step, p.phase, p.phase_since)
            for w, p in peers  # in rank order, as before: who is evicted first decides the next generation
            if p.last_seen < lease_cut or (hung and p.phase in ("compute", "allreduce"))
        ]
        return agents, members

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
            members=members,
            pending=list(self.state.joiners),
            draining=sorted(self.state.draining),
            events=self.events.recent(20),
        )
