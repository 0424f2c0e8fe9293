"""The hardware's side of a simulated run: when nodes fail, come back from repair, and are taken and given
back by higher-priority work. It does not depend on how the job recovers, so every strategy meets the same
timeline (common random numbers: differences between strategies are not noise between draws)."""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass
from typing import Literal

from slurm_elastic.simulate.scenario import Scenario

__all__ = ["Change", "capacity_changes"]

Kind = Literal["failure", "repaired", "preempted", "released"]


@dataclass(frozen=True)
class Change:
    """At `hour`, the job's usable nodes become `capacity` (of the scenario's `nodes`). `hit`: the change took
    a node the job was running on (a failure on one of its nodes, or work that preempted one of them);
    `batch_host`: that node was the job's batch host; `in_step`: how far into a step the fault struck (0..1)."""

    hour: float
    kind: Kind
    capacity: int
    hit: bool = False
    batch_host: bool = False
    in_step: float = 0.0


def capacity_changes(scenario: Scenario, seed: int) -> list[Change]:
    """Every change of the job's usable nodes over the run, in time order, drawn from `seed`."""
    rng = random.Random(seed)
    n, machines, end = scenario.nodes, scenario.nodes + scenario.spares, scenario.hours
    arrivals: list[tuple[float, int, str, int]] = []  # (hour, order, what, nodes)
    order = 0

    def schedule(hour: float, what: str, count: int) -> None:
        nonlocal order
        if hour < end:
            heapq.heappush(arrivals, (hour, order, what, count))
            order += 1

    # Node failures are drawn for every machine (spares fail too); one that strikes a machine already down
    # is dropped below (thinning), so the rate is per machine that is up.
    node_rate = scenario.node_failures_per_hour * machines
    racks = math.ceil(machines / scenario.rack_nodes)
    rack_rate = scenario.rack_failures_per_rack_day / 24.0 * racks
    burst_rate = scenario.preemption_bursts_per_day / 24.0
    for rate, what in ((node_rate, "node"), (rack_rate, "rack"), (burst_rate, "burst")):
        hour = 0.0
        while rate > 0:
            hour += rng.expovariate(rate)
            if hour >= end:
                break
            schedule(hour, what, 1)

    down = 0  # machines in repair or taken by preemption
    changes: list[Change] = []
    while arrivals:
        hour, _, what, count = heapq.heappop(arrivals)
        up = machines - down
        before = min(n, up)
        if what in ("repaired", "released"):
            down -= count
            changes.append(Change(hour, "repaired" if what == "repaired" else "released", min(n, machines - down)))
            continue
        if what == "burst":
            taken = min(scenario.preemption_nodes, up)
            down += taken
            schedule(hour + scenario.preemption_hours, "released", taken)
            after = min(n, machines - down)
            changes.append(Change(hour, "preempted", after, hit=after < before, in_step=rng.random()))
            continue
        lost = 1 if what == "node" else min(scenario.rack_nodes, up)
        if what == "node" and rng.random() >= up / machines:
            continue  # struck a machine that is already down
        on_job = rng.random() < before / up if up else False  # the job holds `before` of the `up` machines
        down += lost
        for _ in range(lost):
            schedule(hour + rng.expovariate(1.0 / scenario.repair_hours), "repaired", 1)
        batch_host = on_job and rng.random() < min(lost, before) / before
        changes.append(Change(hour, "failure", min(n, machines - down), hit=on_job, batch_host=batch_host,
                              in_step=rng.random()))  # fmt: skip
    return changes
