"""`slurm-elastic bench coordinator`: the control plane at scale.

One real coordinator (the production code, on its own thread as the launcher runs it) and `agents` simulated
nodes (`slurm_elastic.testing.nodeswarm`: an agent and its workers each, thousands of authenticated
connections from a few processes) that heartbeat at the production interval and step as a job does. Once
the first generation has formed it measures the steady state (the coordinator thread's CPU, the process's
resident memory, frames each way), then injects faults one kind at a time:

- closed: a node's every connection closes (a crash, a kill): detected from the fault until the first
  generation whose announcement has taken out all of that node's workers;
- silent: a node stops sending with its connections open (a hung host, a cut link): the same, after its lease;
- drain: a node's agent asks to leave: until the boundary generation without it;
- join: a new node registers: until the boundary generation with it.

Announcement times are when the first member received the generation's assign; `form_s` runs from there to
the last member's. Every time is the machine's one monotonic clock, read by whichever process saw it.
"""

from __future__ import annotations

import itertools
import json
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_elastic.agentspec import LEASE_TIMEOUT_S
from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.errors import ElasticError
from slurm_elastic.showcase.bench import swarms
from slurm_elastic.wire.channel import new_secret

__all__ = ["CoordinatorPlan", "run"]

JOB = "bench-coordinator"
POLL_S = 0.05


@dataclass(frozen=True)
class CoordinatorPlan:
    agents: int = 256
    workers: int = 1  # per agent
    processes: int = 4  # that play the simulated nodes
    kills: int = 10
    silences: int = 5
    drains: int = 3
    joins: int = 3
    steady_s: float = 10.0
    step_s: float = 1.0
    lease_s: float = LEASE_TIMEOUT_S  # the production default; shorter only for the suite's own run


@dataclass
class Announced:
    """One generation, as every swarm process together saw its announcement."""

    number: int
    first: float
    last: float
    count: int
    world: int
    left: set[str]
    joined: set[str]

    @property
    def delivered(self) -> bool:
        return self.count >= self.world


class Nodes:
    """The swarm processes, and which of them plays which node."""

    def __init__(self, address: str, secret: str, plan: CoordinatorPlan) -> None:
        argv = [sys.executable, "-m", "slurm_elastic.testing.nodeswarm", "--address", address, "--job", JOB,
                "--workers", str(plan.workers), "--step-s", str(plan.step_s)]  # fmt: skip
        ranges = swarms.shares(plan.agents, plan.processes)
        self.procs = swarms.start(argv, "--nodes", ranges, secret, "coordinator")
        self.owner = {f"n{i:05d}": proc for proc, (a, b) in zip(self.procs, ranges, strict=True) for i in range(a, b)}

    def tell(self, proc: swarms.Process, command: dict[str, Any]) -> dict[str, Any]:
        swarms.send_line(proc, json.dumps(command))
        answer = swarms.read_line(proc, "coordinator")
        if "error" in answer:
            raise ElasticError(f"bench coordinator: {answer['error']}")
        return answer

    def fault(self, kind: str, node: str) -> float:
        """Inject one fault; when it happened."""
        if kind == "join":
            self.owner[node] = self.procs[len(self.owner) % len(self.procs)]
        return float(self.tell(self.owner[node], {"do": kind, "node": node})["t"])

    def report(self) -> tuple[int, int, dict[int, Announced]]:
        """Frames sent to and received from the coordinator so far, and every generation announced."""
        sent = received = 0
        generations: dict[int, Announced] = {}
        for proc in self.procs:
            part = self.tell(proc, {"do": "report"})
            sent, received = sent + part["sent"], received + part["received"]
            for number, g in part["generations"].items():
                seen = generations.get(int(number))
                if seen is None:
                    seen = generations[int(number)] = Announced(int(number), g["first"], g["last"], 0, g["world"],
                                                                set(), set())  # fmt: skip
                seen.first, seen.last = min(seen.first, g["first"]), max(seen.last, g["last"])
                seen.count += g["count"]
                seen.left.update(g["left"])
                seen.joined.update(g["joined"])
        return sent, received, generations

    def close(self) -> None:
        swarms.stop(self.procs)


def announced_after(generations: dict[int, Announced], workers: set[str], since: float, how: str) -> Announced | None:
    """The first generation announced after `since` by which every one of `workers` has left (`how` "left")
    or joined ("joined"), counting every generation announced since."""
    covered: set[str] = set()
    for number in sorted(generations):
        gen = generations[number]
        if gen.first < since:
            continue
        covered |= gen.left if how == "left" else gen.joined
        if workers <= covered:
            return gen
    return None


def _wait_for(nodes: Nodes, workers: set[str], since: float, how: str, timeout: float) -> Announced:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gen = announced_after(nodes.report()[2], workers, since, how)
        if gen is not None:
            return gen
        time.sleep(POLL_S)
    raise ElasticError(f"bench coordinator: no generation has {sorted(workers)[:3]} {how} within {timeout:.0f} s")


def _settle(nodes: Nodes, timeout: float = 60.0) -> None:
    """Until the newest generation has reached every member (the next fault then starts from quiet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        generations = nodes.report()[2]
        if generations and generations[max(generations)].delivered:
            return
        time.sleep(POLL_S)
    raise ElasticError(f"bench coordinator: the newest generation did not reach every member in {timeout:.0f} s")


def _paused(events: Path | None) -> list[float]:
    """Each stall of the coordinator's loop long enough to extend every lease (`coordinator_paused`)."""
    if events is None or not events.exists():
        return []
    records = (json.loads(line) for line in events.read_text().splitlines() if '"coordinator_paused"' in line)
    return [r["seconds"] for r in records if r.get("event") == "coordinator_paused"]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


def _allow_connections(count: int) -> None:
    """The coordinator's process holds every connection: past the hard limit on open files, raise it where
    this process may (root), else stop here and say so."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < count:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))
        except (ValueError, OSError):
            raise ElasticError(
                f"bench coordinator: {count} connections need {count} open files; the hard limit is {hard} "
                "(raise it: ulimit -Hn, or run fewer --agents or --workers)"
            ) from None


def run(plan: CoordinatorPlan, log: Callable[[str], None]) -> dict[str, Any]:
    _allow_connections(2 * plan.agents + 1024)  # each node: its agent's connection and its relay's
    secret, rss_idle = new_secret(), _rss_mb()
    with tempfile.TemporaryDirectory(prefix="bench-coordinator-") as job_dir:
        config = CoordinatorConfig(
            job_id=JOB,
            secret=secret,
            expected_workers=plan.agents * plan.workers,
            events_path=Path(job_dir) / "events.jsonl",  # written as a job's are
            lease_timeout_s=plan.lease_s,
        )
        coordinator = CoordinatorThread(config).start()
        nodes = None
        try:
            started = time.monotonic()
            log(f"bench coordinator: {plan.agents} nodes of {plan.workers} workers in {plan.processes} processes")
            nodes = Nodes(coordinator.address, secret, plan)
            _settle(nodes, timeout=600)
            try:
                result = _measure(coordinator, nodes, plan, log)
            except ElasticError as exc:
                paused = _paused(config.events_path)
                raise ElasticError(f"{exc} (its loop stalled {len(paused)} times: {paused[:20]})") from exc
            result["start_s"] = round(time.monotonic() - started, 2)  # every peer connected and in generation 1
            result["coordinator_paused_s"] = _paused(config.events_path)
        finally:
            coordinator.stop()  # first: the swarm's end is not a fault to answer
            if nodes is not None:
                nodes.close()
    result["coordinator_rss_growth_mb"] = round(result["coordinator_rss_mb"] - rss_idle, 1)
    return {"agents": plan.agents, "workers_per_agent": plan.workers, "lease_s": config.lease_timeout_s,
            "heartbeat_s": config.heartbeat_interval_s, **result}  # fmt: skip


def _measure(
    coordinator: CoordinatorThread, nodes: Nodes, plan: CoordinatorPlan, log: Callable[[str], None]
) -> dict[str, Any]:
    log(f"bench coordinator: steady state for {plan.steady_s:.0f} s")
    sent0, received0, _ = nodes.report()
    cpu0, wall0 = coordinator.call(time.thread_time), time.monotonic()
    time.sleep(plan.steady_s)
    cpu1, wall1 = coordinator.call(time.thread_time), time.monotonic()
    sent1, received1, _ = nodes.report()
    wall = wall1 - wall0
    steady = {
        "coordinator_cpu_fraction": round((cpu1 - cpu0) / wall, 3),
        "coordinator_rss_mb": round(_rss_mb(), 1),
        "frames_in_per_s": round((sent1 - sent0) / wall),
        "frames_out_per_s": round((received1 - received0) / wall),
    }
    victims = iter(
        sorted(nodes.owner, reverse=True)
    )  # the last nodes: rank 0 (the first node's) keeps reporting commits
    workers_of = lambda node: {f"{node}-{i}" for i in range(plan.workers)}  # noqa: E731
    detect: dict[str, list[float]] = {"closed": [], "silent": [], "drain": [], "join": []}
    for kind, count, how in (("kill", plan.kills, "left"), ("drain", plan.drains, "left")):
        log(f"bench coordinator: {count} x {kind}")
        for _ in range(count):
            node = next(victims)
            at = nodes.fault(kind, node)
            gen = _wait_for(nodes, workers_of(node), at, how, timeout=60)
            detect["closed" if kind == "kill" else kind].append(gen.first - at)
            _settle(nodes)
    log(f"bench coordinator: {plan.silences} x silence, 1 s apart")
    silenced = []
    for node in itertools.islice(victims, plan.silences):
        silenced.append((node, nodes.fault("silence", node)))
        time.sleep(1.0)
    lease = coordinator.coordinator.config.lease_timeout_s
    for node, at in silenced:
        gen = _wait_for(nodes, workers_of(node), at, "left", timeout=3 * lease + 30)
        detect["silent"].append(gen.first - at)
    _settle(nodes)
    log(f"bench coordinator: {plan.joins} x join")
    for index in range(plan.joins):
        node = f"j{index:05d}"
        at = nodes.fault("join", node)
        gen = _wait_for(nodes, workers_of(node), at, "joined", timeout=60)
        detect["join"].append(gen.first - at)
        _settle(nodes)
    _, _, generations = nodes.report()
    forms = [g.last - g.first for g in generations.values() if g.delivered]
    names = {"closed": "detect_closed", "silent": "detect_silent", "drain": "drain", "join": "join"}
    out = {f"{names[kind]}_{q}_s": _percentile(times, level)
           for kind, times in detect.items() for q, level in (("p50", 0.5), ("p99", 0.99))}  # fmt: skip
    return {
        **out,
        "form_p50_s": _percentile(forms, 0.5),
        "form_p99_s": _percentile(forms, 0.99),
        **steady,
        "frames_per_s": steady["frames_in_per_s"] + steady["frames_out_per_s"],
        "generations": len(generations),
        "faults": {k: len(v) for k, v in detect.items()},
    }
