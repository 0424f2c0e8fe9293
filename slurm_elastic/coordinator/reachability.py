"""Cuts between nodes that still reach the coordinator (a one-way route, a dead fabric port).

No heartbeat stops, so no lease finds them: the members' collective fails at its timeout and they report
a fault. Before re-forming the same members (which would hang the same way), the coordinator has every
member node's agent try to connect to every other (a probe round, `slurm_elastic.probe`), and evicts the
nodes that decide.reachability picks from the pairs that failed. An evicted node's workers are restarted
by its agent but held out of the job, registered and waiting, until a later round finds that the node
reaches every member again: without that, they would join, hang the next group the same way, and be
evicted again, one collective timeout each time.
Runs on the coordinator's loop only.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from slurm_elastic.coordinator.driver import Driver, send
from slurm_elastic.decide import membership as m
from slurm_elastic.decide.reachability import cleared, to_evict
from slurm_elastic.events import EventLog
from slurm_elastic.eventtypes import NodeReadmitted, PeersUnreachable
from slurm_elastic.logs import get_logger
from slurm_elastic.wire import messages as msg

__all__ = ["PROBE_TIMEOUT_S", "RECHECK_S", "Reachability"]

PROBE_TIMEOUT_S = 3.0  # a connect across a working network takes milliseconds; a lost SYN is resent at 1 s
ANSWER_S = 2.0  # beyond the probe's timeout, for the agents' answers to arrive
RECHECK_S = 10.0  # how often a held node is tried again
log = get_logger("slurm_elastic.coordinator")


@dataclass
class Round:
    number: int
    nodes: tuple[str, ...]  # probed, in rank order
    waiting: set[str]
    started: float
    fault: m.Faulted | None  # what triggered it; None: a recheck of held nodes
    failing: set[tuple[str, str]] = field(default_factory=set)


class Reachability:
    def __init__(self, events: EventLog, driver: Driver, *, probe_timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.events, self.driver = events, driver
        self.probe_timeout_s = probe_timeout_s
        self.addresses: dict[str, str] = {}  # node -> where its agent takes probes ("ip:port")
        self.cut: dict[str, float] = {}  # nodes evicted as unreachable -> since when (monotonic)
        self.held: dict[str, m.Joined] = {}  # registered workers of cut nodes, not yet let in
        self.rounds: dict[int, Round] = {}
        self._numbers = itertools.count(1)
        self._last_recheck = 0.0

    # --- what the coordinator tells it ----------------------------------------------------------------

    def agent_registered(self, node: str, probe: str | None) -> None:
        if probe:
            self.addresses[node] = probe

    def agent_lost(self, node: str) -> None:
        self.addresses.pop(node, None)
        for r in self.rounds.values():
            r.waiting.discard(node)

    def hold(self, joined: m.Joined) -> bool:
        """Keep a registering worker of a cut node out of the job for now (True), or let it in."""
        if joined.worker.node not in self.cut or self.driver.state.phase != "running":
            return False
        self.held[joined.worker.worker_id] = joined
        return True

    def worker_gone(self, wid: str) -> None:
        self.held.pop(wid, None)

    def fault(self, fault: m.Faulted) -> None:
        """A member's collective failed: probe the members' nodes first, unless a round already answers it."""
        state = self.driver.state
        gen = state.generation
        if state.phase != "running" or gen is None or fault.generation != gen.number:
            self.driver.feed(fault)  # stale or out of place: the reducer says which
            return
        if any(r.fault is not None and r.fault.generation == fault.generation for r in self.rounds.values()):
            return  # one round per generation answers every member's report
        nodes = self._member_nodes()
        if len(nodes) < 2:  # nothing to probe: no pair of nodes between which a cut could lie
            self.driver.feed(fault)
            return
        self._start(nodes, fault)

    def result(self, node: str, answer: msg.ProbeResult) -> None:
        r = self.rounds.get(answer.round)
        if r is None or node not in r.waiting:
            return
        r.waiting.discard(node)
        probed = set(r.nodes)
        r.failing.update((node, other) for other in answer.unreachable if other in probed)
        if not r.waiting:
            self._conclude(r)

    def tick(self, now: float) -> None:
        for r in [r for r in self.rounds.values() if now - r.started > self.probe_timeout_s + ANSWER_S]:
            self._conclude(r)  # an agent that did not answer in time: its lease judges it, not this
        if self.held and self.driver.state.phase != "running":  # a restart or the end: nothing to keep out
            self._readmit(list(self.cut), now)
        elif self.held and not self.rounds and now - self._last_recheck >= RECHECK_S:
            self._last_recheck = now
            waiting = sorted({j.worker.node for j in self.held.values()} & set(self.addresses))
            self._start((*self._member_nodes(), *waiting), None)

    # --- rounds ---------------------------------------------------------------------------------------

    def _member_nodes(self) -> tuple[str, ...]:
        workers = self.driver.state.workers
        nodes = dict.fromkeys(workers[w].node for w in self.driver.state.members if w in workers)
        return tuple(n for n in nodes if n in self.addresses)

    def _start(self, nodes: tuple[str, ...], fault: m.Faulted | None) -> None:
        number = next(self._numbers)
        targets = {n: self.addresses[n] for n in nodes}
        probe = msg.Probe(round=number, targets=targets, timeout_s=self.probe_timeout_s)
        waiting = {n for n in nodes if n in self.driver.agents}
        self.rounds[number] = Round(number, nodes, waiting, time.monotonic(), fault)
        for node in waiting:
            send(self.driver.agents.get(node), probe)
        log.info("probe_round", round=number, nodes=len(nodes), trigger="fault" if fault else "recheck")

    def _conclude(self, r: Round) -> None:
        del self.rounds[r.number]
        now = time.monotonic()
        if r.fault is None:
            self._readmit([n for n in r.nodes if n in self.cut and cleared(n, r.failing)], now)
            return
        state = self.driver.state
        if state.phase != "running" or state.generation is None or state.generation.number != r.fault.generation:
            return  # the membership changed meanwhile (a node was lost): that change answers the fault
        r.failing = {(a, b) for a, b in r.failing if a in self.driver.agents and b in self.driver.agents}
        evicted = to_evict(r.failing, r.nodes)
        pairs = tuple(f"{a}>{b}" for a, b in sorted(r.failing))
        self.events.record(
            PeersUnreachable(r.fault.generation, len(r.nodes), pairs, evicted, round(now - r.started, 3))
        )
        if not evicted:
            self.driver.feed(r.fault)  # nobody is cut off: re-form the same members
            return
        self.driver.record.silence_evicted(self.driver.record.last_commit_at)  # the stall began after it
        for node in evicted:
            self.cut[node] = now
            others = sorted({b if a == node else a for a, b in r.failing if node in (a, b)})
            cause = f"node {node} unreachable from {', '.join(others)}"
            for wid in [w for w, p in self.driver.workers.items() if p.node == node]:
                send(self.driver.agents.get(node), msg.KillWorker(worker_id=wid, reason=cause))
                self.driver.lose(wid, cause)

    def _readmit(self, nodes: list[str], now: float) -> None:
        for node in nodes:
            since = self.cut.pop(node, now)
            joined = [j for w, j in self.held.items() if j.worker.node == node]
            for j in joined:
                del self.held[j.worker.worker_id]
            self.events.record(NodeReadmitted(node, tuple(j.worker.worker_id for j in joined), round(now - since, 2)))
            for j in joined:
                if j.worker.worker_id in self.driver.workers:  # still connected
                    self.driver.feed(j)
