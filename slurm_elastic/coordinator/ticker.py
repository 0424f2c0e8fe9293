"""The coordinator's clock. Every TICK_S it makes up for its own stalls (a stopped process must not count
against its peers), sends every peer the pulse that is the coordinator's lease, lets the reducer and the
probe rounds (reachability) see time pass, and every LIVENESS_S judges the peers' leases and hangs
(decide.health) and evicts whom they condemn.
Runs on the coordinator's loop only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.coordinator.driver import Driver, send
from slurm_elastic.coordinator.peers import Peer
from slurm_elastic.coordinator.reachability import Reachability
from slurm_elastic.coordinator.relayed import RelayedWriter
from slurm_elastic.decide import membership as m
from slurm_elastic.decide import quorum
from slurm_elastic.decide.health import Liveness, Verdict, find_unresponsive, stalled_for
from slurm_elastic.events import EventLog
from slurm_elastic.eventtypes import ControlLoopFailed, CoordinatorPaused, HangEvicted, NodeUnresponsive
from slurm_elastic.wire import messages as msg
from slurm_elastic.wire.channel import encode_frame

TICK_S = 0.1
LIVENESS_S = 0.5  # leases and hangs are judged this often: a scan is O(peers), the lease is seconds long


class Ticker:
    def __init__(self, config: CoordinatorConfig, events: EventLog, driver: Driver, reach: Reachability) -> None:
        self.config, self.events, self.driver, self.reachability = config, events, driver, reach
        self.workers, self.agents = driver.workers, driver.agents
        self._last_tick = self._last_pulse = self._last_scan = time.monotonic()
        self._last_tick_cpu = 0.0  # the loop thread's CPU time at the last tick (set on the loop's thread)
        self._silence: quorum.SilenceWindow | None = None  # nodes fallen silent within the last lease

    async def run(self) -> None:
        self._last_tick_cpu = time.thread_time()
        while True:
            await asyncio.sleep(TICK_S)
            self.tick(time.monotonic())

    def died(self, reason: str) -> None:
        """Without its ticker the coordinator sends no pulses and detects nothing: fail the job now, saying
        why, rather than let every agent find it silent a lease later."""
        self.events.record(ControlLoopFailed(reason, loop="ticker"))
        self.driver.fail(reason)

    def tick(self, now: float) -> None:
        self._make_up_for_a_stall(now)
        if now - self._last_pulse >= self.config.heartbeat_interval_s:
            self._last_pulse = now
            self._pulse()
        self.driver.feed(m.Tick())
        self.reachability.tick(now)
        if self.driver.state.phase == "running" and now - self._last_scan >= LIVENESS_S:
            self._last_scan = now
            self._evict_unresponsive(now)

    def _make_up_for_a_stall(self, now: float) -> None:
        cpu = time.thread_time()  # the loop's own thread: busy is slow, not stopped
        stalled = stalled_for(self._last_tick, now, TICK_S, busy_s=cpu - self._last_tick_cpu)
        self._last_tick, self._last_tick_cpu = now, cpu
        if stalled:  # this process was stopped: nobody else's silence in that time counts against them
            for held in self._peers():
                held.last_seen += stalled
                held.phase_since += stalled
            self.events.record(CoordinatorPaused(round(stalled, 2)))

    def _pulse(self) -> None:
        gen = self.driver.state.generation
        pulse = encode_frame(msg.Pulse(generation=gen.number if gen else 0))  # one encoding for every peer
        for peer in self._peers():  # a relayed worker's comes through its node's agent (and relay)
            if not isinstance(peer.writer, RelayedWriter) and not peer.writer.is_closing():
                peer.writer.write(pulse)

    def _evict_unresponsive(self, now: float) -> None:
        agents, members = self.suspects(now)
        lease, hang = self.config.lease_timeout_s, self.config.hang_timeout_s
        silent = find_unresponsive(now, agents, lease_timeout_s=lease, hang_timeout_s=hang)
        self._silence = quorum.observe(self._silence, now, set(self.agents), {v.worker_id for v in silent}, lease)
        quiet = self._quiet_nodes(now) - {v.worker_id for v in silent}
        match quorum.verdict(self._silence, set(self.agents), quiet):
            case "stop":
                self._stop_without_majority(silent)
                return
            case "wait":
                return
        for verdict in silent:
            node = verdict.worker_id
            self.events.record(NodeUnresponsive(node, verdict.reason))
            agent = self.agents.pop(node)
            agent.writer.close()
            workers = [w for w, p in self.workers.items() if p.node == node]
            if set(workers) & set(self.driver.state.members):  # a recovery follows: it reports the silence
                self.driver.record.silence_evicted(agent.last_seen)
            for w in workers:
                self.driver.lose(w, f"node {node} unresponsive")
        for verdict in find_unresponsive(now, members, lease_timeout_s=lease, hang_timeout_s=hang):
            peer = self.workers.get(verdict.worker_id)
            if peer is None or (verdict.cause == "lease" and peer.node in quiet):
                continue  # a quiet node's workers go with it, or stay with it, once its agent is judged
            self.events.record(HangEvicted(verdict.worker_id, verdict.cause, verdict.reason))
            if verdict.cause == "lease":
                self.driver.record.silence_evicted(peer.last_seen)
            send(self.agents.get(peer.node), msg.KillWorker(worker_id=verdict.worker_id, reason=verdict.reason))
            self.driver.lose(verdict.worker_id, f"{verdict.cause}: {verdict.reason}")

    def _quiet_nodes(self, now: float) -> set[str]:
        """Nodes near their lease: a worker's heartbeat, or another node of the same cut, may reach its lease
        up to an interval (and a scan) before this node's agent does."""
        cfg = self.config
        margin = min(2 * cfg.heartbeat_interval_s + LIVENESS_S, cfg.lease_timeout_s / 2)
        cut = now - cfg.lease_timeout_s + margin
        return {node for node, agent in self.agents.items() if agent.last_seen < cut}

    def _stop_without_majority(self, silent: tuple[Verdict, ...]) -> None:
        """Silence took half the nodes or more at once (decide.quorum): stop this side without a new
        generation, so nothing more is committed or written here; the launcher requeues the job if Slurm
        still answers it (else the other side's agents do)."""
        window = self._silence
        assert window is not None
        for verdict in silent:
            self.events.record(NodeUnresponsive(verdict.worker_id, verdict.reason))
        names = ", ".join(sorted(window.silent))
        reason = (
            f"{len(window.silent)} of {len(window.nodes)} nodes fell silent within a lease ({names}): this side "
            "has no majority of the job (the batch host cut off from the others?); it stops without writing "
            "anything, and the job is requeued to resume from its latest checkpoint"
        )
        self.driver.requeue_after_failure = True
        self.driver.fail(reason)

    def suspects(self, now: float) -> tuple[list[Liveness], list[Liveness]]:
        """The agents and members that may be silent or hung, as `find_unresponsive` needs them (with every
        member waiting in a reduction where one may be hung). Only suspects become records: reading two
        numbers of every peer is cheap; a record for each, twice a second at 4,096 nodes, was not."""
        cfg, state = self.config, self.driver.state
        lease_cut, hang_cut = now - cfg.lease_timeout_s, now - cfg.hang_timeout_s
        agents = [
            Liveness(n, p.last_seen, 0, "agent", p.last_seen) for n, p in self.agents.items() if p.last_seen < lease_cut
        ]

        def live() -> Iterator[tuple[str, Peer]]:
            # Generated, never listed: a list of 16,384 pairs twice a second kept enough young objects alive
            # to set off full collections of the heap (half a second each at that size).
            return ((w, p) for w in state.members if (p := self.workers.get(w)) is not None and w not in state.ended)

        hung = any(p.phase == "compute" and p.phase_since < hang_cut for _, p in live())
        members = [
            Liveness(w, p.last_seen, p.step, p.phase, p.phase_since)
            for w, p in live()  # in rank order, as before: who is evicted first decides the next generation
            if p.last_seen < lease_cut or (hung and p.phase in ("compute", "allreduce"))
        ]
        return agents, members

    def _peers(self) -> tuple[Peer, ...]:
        return (*self.workers.values(), *self.agents.values())


__all__ = ["LIVENESS_S", "TICK_S", "Ticker"]
