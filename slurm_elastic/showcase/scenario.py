"""Run a local job through a scripted scenario (kill a node at step k, add one at step j, drain...) and
collect what happened: the job's result, its events, its commits, each kill's recovery, the ledger.

Shared by the multi-process tests, `slurm-elastic demo` and `slurm-elastic bench`.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from slurm_elastic.config import JobConfig
from slurm_elastic.events import read_events
from slurm_elastic.eventtypes import Commit, E, of_kind
from slurm_elastic.faults import FaultPlan
from slurm_elastic.launch.local import JobResult, LocalJob
from slurm_elastic.ledger import LedgerReport, analyze
from slurm_elastic.showcase.metrics import Recovery, recovery_after

ActionKind = Literal["kill_node", "add_node", "drain_node", "sigterm_node"]


@dataclass(frozen=True)
class Action:
    at_step: int
    kind: ActionKind
    node: str | None = None
    delay_s: float = 0.0  # wait this long after the step commits (to land mid-step)


@dataclass
class ScenarioResult:
    job_id: str
    job_dir: Path
    result: JobResult
    events: list[dict[str, Any]]
    commits: list[Commit]
    recoveries: list[Recovery]
    ledger: LedgerReport | None
    elapsed_s: float
    actions_done: list[tuple[Action, str, float]] = field(default_factory=list)

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        """The job's records of any kind (`of` reads a catalogued kind as its type)."""
        return [e for e in self.events if e["event"] == kind]

    def of(self, kind: type[E]) -> list[E]:
        """The job's events of one catalogued kind, as its type."""
        return of_kind(self.events, kind)


def run_scenario(
    command: list[str],
    config: JobConfig,
    *,
    root: Path,
    actions: Sequence[Action] = (),
    faults: FaultPlan | None = None,
    timeout_s: float = 300.0,
    log_dir: Path | None = None,
    extra_env: dict[str, str] | None = None,
    on_action: Callable[[Action, str], None] | None = None,
) -> ScenarioResult:
    started = time.monotonic()
    job = LocalJob(command, config, faults=faults, log_dir=log_dir, root=root, extra_env=extra_env)
    kills: list[float] = []
    done: list[tuple[Action, str, float]] = []
    job.start()
    try:
        for action in sorted(actions, key=lambda a: a.at_step):
            remaining = timeout_s - (time.monotonic() - started)
            job.wait_until(lambda v, a=action: v.last_step >= a.at_step, timeout=remaining)  # type: ignore[misc]
            if action.delay_s:
                time.sleep(action.delay_s)
            node, when = _perform(job, action)
            if action.kind == "kill_node":
                kills.append(when)
            done.append((action, node, when))
            if on_action:
                on_action(action, node)
        result = job.wait(timeout=max(1.0, timeout_s - (time.monotonic() - started)))
    finally:
        job.stop()
    commits = job.view().commits
    ledger = analyze(config.ledger_dir) if config.ledger_dir else None
    return ScenarioResult(
        job_id=job.job_id,
        job_dir=job.dir,
        result=result,
        events=read_events(job.dir / "events.jsonl"),
        commits=commits,
        recoveries=[recovery_after(t, commits) for t in kills],
        ledger=ledger,
        elapsed_s=time.monotonic() - started,
        actions_done=done,
    )


def _perform(job: LocalJob, action: Action) -> tuple[str, float]:
    if action.kind == "add_node":
        return job.add_node(action.node), time.time()
    if action.node is None:
        raise ValueError(f"{action.kind} needs a node")
    if action.kind == "kill_node":
        return action.node, job.kill_node(action.node, signal.SIGKILL)
    if action.kind == "sigterm_node":
        return action.node, job.kill_node(action.node, signal.SIGTERM)
    assert job.coordinator is not None
    job.coordinator.drain([action.node], "boundary", "scenario")
    return action.node, time.time()
