"""How a training job fares on a timeline of capacity changes, by the way it recovers.

- `checkpoint_restart`: every node lost restarts the whole job from its latest checkpoint (Slurm's requeue
  and the restart's own load), taken every Young/Daly interval; it runs only at full size.
- `checkpointless`: the survivors heal in process (our measured MTTR) and a spare node joins (our measured
  join time); without a spare it waits at full size's state in memory until one is repaired.
- `elastic`: the same, but the job goes on at the size it has (the global batch kept: a step takes longer)
  and grows when nodes come back.
Both of ours step slower than plain DDP by the measured ratio, and the batch host's loss takes them down the
checkpoint path (it holds the coordinator), so they also checkpoint, at the interval for that rarer loss.

Progress is counted in hours of the plain DDP job at full size: goodput is progress over wall time."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from slurm_elastic.simulate.checkpointing import young_daly_interval
from slurm_elastic.simulate.scenario import Measured, Scenario
from slurm_elastic.simulate.timeline import Change

__all__ = ["STRATEGIES", "Outcome", "Policy", "policy", "run_policy"]

Strategy = Literal["checkpoint_restart", "checkpointless", "elastic"]
STRATEGIES: tuple[Strategy, ...] = ("checkpoint_restart", "checkpointless", "elastic")


@dataclass(frozen=True)
class Policy:
    """A strategy's costs, in hours. `rate`: progress per hour at full size."""

    name: Strategy
    in_process: bool
    elastic: bool
    rate: float
    interval_h: float
    write_h: float
    restart_h: float
    recover_h: float = 0.0
    join_h: float = 0.0


@dataclass(frozen=True)
class Outcome:
    strategy: Strategy
    goodput: float
    wasted_gpu_hours: float
    lost_steps: int
    interruptions: int
    checkpoint_interval_s: float | None

    def as_json(self) -> dict[str, float | int | None]:
        return {
            "goodput": round(self.goodput, 5),
            "wasted_gpu_hours": round(self.wasted_gpu_hours, 1),
            "lost_steps": self.lost_steps,
            "interruptions": self.interruptions,
            "checkpoint_interval_s": _rounded(self.checkpoint_interval_s),
        }


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def policy(name: Strategy, scenario: Scenario, measured: Measured) -> Policy:
    """The costs of strategy `name` in `scenario`, our figures taken from `measured`."""
    hour = 3600.0
    write_h, step_h = scenario.checkpoint_write_s / hour, scenario.step_s / hour
    restart_h = (measured.requeue_s + scenario.restart_load_s) / hour
    node_rate = scenario.node_failures_per_hour + scenario.rack_failures_per_rack_day / 24.0
    if name == "checkpoint_restart":
        mtbf_h = 1.0 / (node_rate * scenario.nodes) if node_rate else math.inf
        interval = _interval(scenario, write_h, mtbf_h, step_h)
        return Policy(name, in_process=False, elastic=False, rate=1.0, interval_h=interval, write_h=write_h,
                      restart_h=restart_h)  # fmt: skip
    batch_host_mtbf_h = 1.0 / node_rate if node_rate else math.inf
    return Policy(
        name,
        in_process=True,
        elastic=name == "elastic",
        rate=1.0 / max(1.0, measured.step_ratio),  # a slower step counts against us; a faster one (noise) never for
        interval_h=_interval(scenario, write_h, batch_host_mtbf_h, step_h),
        write_h=write_h,
        restart_h=restart_h,
        recover_h=measured.mttr_s / hour,
        join_h=measured.join_s / hour,
    )


def _interval(scenario: Scenario, write_h: float, mtbf_h: float, step_h: float) -> float:
    if scenario.checkpoint_interval_s is not None:
        return scenario.checkpoint_interval_s / 3600.0
    return young_daly_interval(write_h, mtbf_h, floor_h=step_h)


def run_policy(p: Policy, scenario: Scenario, changes: list[Change]) -> Outcome:
    """Play `changes` against policy `p` over the scenario's hours."""
    job = _Job(p, scenario)
    for change in changes:
        job.advance_to(change.hour)
        job.on(change)
    job.advance_to(scenario.hours)
    goodput = job.progress / scenario.hours
    return Outcome(
        strategy=p.name,
        goodput=goodput,
        wasted_gpu_hours=scenario.gpus * scenario.hours * (1.0 - goodput),
        lost_steps=round(job.lost_steps),
        interruptions=job.interruptions,
        checkpoint_interval_s=None if p.interval_h == math.inf else p.interval_h * 3600.0,
    )


class _Job:
    """One job's state between capacity changes: running (computing or writing a checkpoint), stalled (a
    recovery, a join or a restart under way) or waiting (not enough nodes to run)."""

    def __init__(self, p: Policy, scenario: Scenario) -> None:
        self.p, self.full = p, scenario.nodes
        self.step_h = scenario.step_s / 3600.0
        self.now = 0.0
        self.capacity = scenario.nodes
        self.stalled_until = 0.0  # no progress before this hour
        self.waiting = False
        self.restart_pending = False  # when nodes suffice again: restart from the checkpoint (else: a join)
        self.saved = 0.0  # progress in the latest checkpoint
        self.fresh = 0.0  # progress since, in memory
        self.cycle = 0.0  # running time into the current interval-and-write cycle
        self.lost_steps = 0.0
        self.interruptions = 0

    @property
    def progress(self) -> float:
        return self.saved + self.fresh

    def _rate(self) -> float:
        share = self.capacity / self.full if self.p.elastic else 1.0
        return self.p.rate * share

    def _can_run(self) -> bool:
        return self.capacity >= 1 if self.p.elastic else self.capacity == self.full

    def advance_to(self, hour: float) -> None:
        start = max(self.now, self.stalled_until)
        self.now = max(self.now, hour)
        if self.waiting or start >= hour:
            return
        self._run(hour - start)

    def _run(self, span: float) -> None:
        """Compute and checkpoint for `span` hours of running time."""
        interval, write, rate = self.p.interval_h, self.p.write_h, self._rate()
        if interval == math.inf:
            self.fresh += rate * span
            return
        period = interval + write
        if self.cycle > 0:  # finish the cycle under way
            part = min(span, period - self.cycle)
            self.fresh += rate * max(0.0, min(self.cycle + part, interval) - self.cycle)
            self.cycle += part
            span -= part
            if self.cycle >= period:
                self.saved, self.fresh, self.cycle = self.saved + self.fresh, 0.0, 0.0
        whole = math.floor(span / period)
        self.saved += whole * rate * interval
        span -= whole * period
        if span > 0:
            self.fresh += rate * min(span, interval)
            self.cycle = span

    def _stall(self, hours: float) -> None:
        self.stalled_until = max(self.stalled_until, self.now) + hours if hours else self.stalled_until

    def on(self, change: Change) -> None:
        grew, refilled = change.capacity > self.capacity, change.capacity == self.capacity
        self.capacity = change.capacity
        if change.hit:
            self._hit(change, refilled)
        if self.waiting:
            if self._can_run():
                self.waiting = False
                self._stall(self.p.restart_h if self.restart_pending else self.p.join_h)
                self.restart_pending = False
        elif grew and self.p.elastic:
            self._stall(self.p.join_h)  # the new nodes join at a step boundary

    def _hit(self, change: Change, refilled: bool) -> None:
        """A node the job ran on is gone; `refilled`: a spare took its place."""
        if not self.waiting:
            self.interruptions += 1
        graceful = change.kind == "preempted"  # Slurm's SIGTERM: a checkpoint, or a drain at a boundary
        from_checkpoint = not self.p.in_process or change.batch_host
        if from_checkpoint and not graceful:
            self.lost_steps += self.fresh / self.step_h
            self.fresh, self.cycle = 0.0, 0.0
        elif from_checkpoint:
            self.saved, self.fresh, self.cycle = self.progress, 0.0, 0.0
        else:
            lost = 0.0 if graceful else change.in_step  # the step in flight runs again
            self.lost_steps += lost
            self.stalled_until = max(self.stalled_until, self.now)
        if not self._can_run() or from_checkpoint:
            self.restart_pending = self.restart_pending or from_checkpoint
            self.waiting = not self._can_run()
            if not self.waiting:  # from the checkpoint, on the nodes there are
                self.stalled_until = self.now + self.p.restart_h + (self.p.write_h if graceful else 0.0)
            return
        # in process: the survivors re-form and re-run the step; a spare that took the node's place joins
        # (at full size the job waits for it; elastic goes on without it and grows when it is in)
        rerun = (0.0 if graceful else change.in_step) * self.step_h / self._rate()
        if not self.p.elastic:
            wait = max(self.p.recover_h, self.p.join_h)
        else:
            wait = self.p.recover_h + (self.p.join_h if refilled else 0.0)
        self.stalled_until = self.now + wait + rerun
