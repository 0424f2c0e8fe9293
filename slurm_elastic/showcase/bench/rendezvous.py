"""`slurm-elastic bench rendezvous`: what forming a generation's process group costs the coordinator's store,
against world size.

Every generation forms new groups through the store. Two patterns, both measured:

- Operations per generation, of torch's own gloo group: real `ProcessGroupGloo`s, as ranks in threads,
  formed through a real coordinator's store at small worlds, counted by the store. A rank publishes its
  address, then waits for and reads every rank's (N + 2 N^2 in all). NCCL needs one unique id: rank 0
  publishes it and every other rank reads it (torch's ProcessGroupNCCL: N in all; counted here from its
  documented pattern, there being no GPU).
- Time, at scale: simulated ranks (`slurm_elastic.testing.swarm`, a few processes) run each pattern against
  one real coordinator, twice: each rank with a store connection of its own (`relay: false`), and, as the
  node agents run it, `per_node` ranks of a node behind its store relay (`rendezvous.relay`: one connection
  per node, identical reads in flight merged; `relay: true`). `form_s` runs from the first request to the
  last reply, as the ranks see it; `store_cpu_s` is the coordinator thread's CPU time in it. Worlds too large
  to run (gloo's N^2) are projected from the largest measured one's operations per second, and say
  `measured: false`.
"""

from __future__ import annotations

import collections
import datetime
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.coordinator.driver import STORE_PREFIX
from slurm_elastic.errors import ElasticError
from slurm_elastic.rendezvous.client import CoordinatorStore
from slurm_elastic.showcase.bench import swarms
from slurm_elastic.wire.channel import new_secret

__all__ = ["RendezvousPlan", "gloo_store_ops", "run"]

JOB = "bench-rendezvous"
PROJECTED = (1024, 4096, 16384)


@dataclass(frozen=True)
class RendezvousPlan:
    nccl_worlds: tuple[int, ...] = (1024, 4096, 16384)
    gloo_worlds: tuple[int, ...] = (32, 64, 128)
    counted_worlds: tuple[int, ...] = (2, 4, 8)  # real gloo groups, ranks as threads
    processes: int = 4  # that play the simulated ranks
    per_node: int = 8  # ranks behind one node's relay
    rounds: int = 3  # generations formed per world; the median is reported


def gloo_store_ops(worlds: tuple[int, ...]) -> dict[int, dict[str, int]]:
    """Store operations by kind that forming one real gloo group of each world size costs."""
    return {world: _count_gloo(world) for world in worlds}


def _count_gloo(world: int) -> dict[str, int]:
    secret = new_secret()
    coordinator = CoordinatorThread(CoordinatorConfig(job_id=JOB, secret=secret, expected_workers=world)).start()
    stores = [CoordinatorStore(coordinator.address, secret, JOB, 60.0) for _ in range(world)]
    groups: list[Any] = [None] * world
    errors: list[BaseException] = []

    def form(rank: int) -> None:
        try:
            scoped = dist.PrefixStore(f"{STORE_PREFIX}/g1", stores[rank])
            groups[rank] = dist.ProcessGroupGloo(scoped, rank, world, datetime.timedelta(seconds=60))
        except BaseException as exc:  # reported below, with the world it failed in
            errors.append(exc)

    served = lambda: collections.Counter(coordinator.coordinator.store.served)  # noqa: E731
    try:
        before = coordinator.call(served)
        threads = [threading.Thread(target=form, args=(rank,)) for rank in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        if errors or any(g is None for g in groups):
            raise ElasticError(f"bench rendezvous: a gloo group of {world} did not form: {errors[:1]}")
        return dict(coordinator.call(served) - before)
    finally:
        for store in stores:
            store.close()
        coordinator.stop()


class _Swarm:
    """`processes` swarm processes playing `world` ranks of one pattern against `coordinator`, `per_node`
    of them behind each node's relay (0: each rank direct)."""

    def __init__(
        self, coordinator: CoordinatorThread, secret: str, pattern: str, world: int, plan: RendezvousPlan, per_node: int
    ):
        self.coordinator = coordinator
        argv = [sys.executable, "-m", "slurm_elastic.testing.swarm", "--address", coordinator.address,
                "--job", JOB, "--world", str(world), "--pattern", pattern, "--rounds", str(plan.rounds),
                "--prefix", STORE_PREFIX, "--per-node", str(per_node)]  # fmt: skip
        unit = max(1, per_node)  # a node's ranks stay in one process
        ranges = [(a * unit, min(b * unit, world)) for a, b in swarms.shares(-(-world // unit), plan.processes)]
        self.procs = swarms.start(argv, "--ranks", ranges, secret, "rendezvous")

    def round(self) -> tuple[float, float, int]:
        """One generation formed by every simulated rank: (wall seconds, coordinator CPU seconds, store ops)."""
        served = lambda: sum(self.coordinator.coordinator.store.served.values())  # noqa: E731
        cpu_before, ops_before = self.coordinator.call(time.thread_time), self.coordinator.call(served)
        for proc in self.procs:
            swarms.send_line(proc, "go")
        results = [swarms.read_line(proc, "rendezvous") for proc in self.procs]
        cpu = self.coordinator.call(time.thread_time) - cpu_before
        wall = max(r["ended"] for r in results) - min(r["started"] for r in results)
        return wall, cpu, self.coordinator.call(served) - ops_before

    def close(self) -> None:
        swarms.stop(self.procs)


def measure(pattern: str, world: int, plan: RendezvousPlan, relay: bool) -> dict[str, Any]:
    """Form `plan.rounds` generations of `world` simulated ranks; the median round."""
    secret = new_secret()
    coordinator = CoordinatorThread(CoordinatorConfig(job_id=JOB, secret=secret, expected_workers=world)).start()
    swarm = None
    try:
        swarm = _Swarm(coordinator, secret, pattern, world, plan, plan.per_node if relay else 0)
        rounds = [swarm.round() for _ in range(plan.rounds)]
    finally:
        if swarm is not None:
            swarm.close()
        coordinator.stop()
    wall = statistics.median(r[0] for r in rounds)
    cpu = statistics.median(r[1] for r in rounds)
    ops = rounds[0][2]
    return {"backend": pattern, "ranks": world, "relay": relay, "store_ops": ops, "measured": True,
            "form_s": round(wall, 4), "store_cpu_s": round(cpu, 4), "ops_per_s": round(ops / wall)}  # fmt: skip


def modelled_ops(pattern: str, world: int, per_node: int) -> int:
    """Store operations that reach the coordinator for one group: direct (`per_node` 0), every rank's own;
    through relays, each node's identical reads once (the ideal merge, which the measured runs approach)."""
    readers = -(-world // per_node) if per_node else world
    return world + 2 * world * readers if pattern == "gloo" else readers + (1 if per_node else 0)


def run(plan: RendezvousPlan, log: Callable[[str], None]) -> dict[str, Any]:
    started = time.monotonic()
    log(f"bench rendezvous: store operations of real gloo groups of {', '.join(map(str, plan.counted_worlds))}")
    counted = gloo_store_ops(plan.counted_worlds)
    per_world = {w: sum(c.values()) for w, c in counted.items()}
    mismatch = {w: n for w, n in per_world.items() if n != w + 2 * w * w}
    if mismatch:
        raise ElasticError(f"bench rendezvous: gloo groups cost {mismatch} store ops, not N + 2 N^2: the model is off")
    results = []
    for pattern, worlds in (("nccl", plan.nccl_worlds), ("gloo", plan.gloo_worlds)):
        for relay in (False, True):
            for world in worlds:
                via = f"relays of {plan.per_node} ranks" if relay else "a connection per rank"
                log(f"bench rendezvous: {pattern}, {world} simulated ranks through {via}, {plan.rounds} generations")
                results.append(measure(pattern, world, plan, relay))
    for pattern in ("nccl", "gloo"):
        for relay in (False, True):
            ran = [r for r in results if r["backend"] == pattern and r["relay"] == relay]
            largest = max(ran, key=lambda r: r["ranks"])
            per_node = plan.per_node if relay else 0
            for world in PROJECTED:
                if any(r["ranks"] == world for r in ran):
                    continue
                ops = round(largest["store_ops"] * modelled_ops(pattern, world, per_node)
                            / modelled_ops(pattern, largest["ranks"], per_node))  # fmt: skip
                results.append({"backend": pattern, "ranks": world, "relay": relay, "store_ops": ops,
                                "measured": False, "form_s": round(ops / largest["ops_per_s"], 3)})  # fmt: skip
    results.sort(key=lambda r: (r["backend"], r["relay"], r["ranks"]))

    def nccl_16k(relay: bool) -> float | None:
        found = [r["form_s"] for r in results if r["backend"] == "nccl" and r["ranks"] == 16384 and r["relay"] == relay]
        return found[0] if found else None

    return {
        "results": results,
        "gloo_store_ops_counted": {str(w): c for w, c in counted.items()},
        "target_nccl_16384_form_s": 0.5,
        "nccl_16384_form_s": nccl_16k(True),  # the production path: the node agents run relays
        "nccl_16384_form_s_direct": nccl_16k(False),
        "ranks_per_node": plan.per_node,
        "processes": plan.processes,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
