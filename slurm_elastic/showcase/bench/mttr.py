"""`slurm-elastic bench mttr`: time to recover from the SIGKILL of a node, elastic versus checkpoint-restart.

Both modes train the same workload on the same number of local nodes. Each kill lands at a random point
of a step; MTTR runs from the kill to the commit of the step after the last one committed before it. The
baseline restarts every worker process (interpreter, torch import, process group), loads the latest disk
checkpoint (written every `checkpoint_every` steps) and replays the steps lost since, as torchrun-style
recovery does. After each recovery a replacement node joins, so every kill meets the same world size.
`workload="fsdp"`: the ddp workload's char-LM (its width and batch) sharded by FSDP2 (`steploop.py --mode
elastic_fsdp`), healed from peers' mirrored shards, against the same job restarted from its sharded
checkpoint. An in-process recovery re-runs the interrupted step at the smaller world, so its MTTR is at
least one step: the ratio depends on the step time as much as on the recovery.
"""

from __future__ import annotations

import itertools
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from slurm_elastic.config import JobConfig
from slurm_elastic.coordinator.peers import PublicView
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.showcase.metrics import median, recovery_after
from slurm_elastic.showcase.workload import corpus, train_command
from slurm_elastic.waiting import WaitTimedOut

Mode = Literal["in_process", "restart"]
Workload = Literal["ddp", "fsdp"]


@dataclass(frozen=True)
class MttrPlan:
    nodes: int = 4
    kills: int = 5
    warmup_steps: int = 15
    steps_between: int = 12
    checkpoint_every: int = 10
    seed: int = 0
    workload: Workload = "ddp"


@dataclass
class ModeResult:
    mode: Mode
    mttr_s: list[float] = field(default_factory=list)
    lost_steps: list[int] = field(default_factory=list)
    join_s: list[float] = field(default_factory=list)  # a replacement node started to it training in the job
    step_time_s: float | None = None


def _wait(job: LocalJob, what: str, predicate: Callable[[PublicView], bool], timeout: float = 180.0) -> PublicView:
    try:
        return job.wait_until(predicate, timeout, poll=0.01)
    except WaitTimedOut as exc:
        raise SystemExit(f"slurm-elastic bench: {job.job_id}: waiting for {what}: {exc}") from None


def _step_time(view: PublicView) -> float:
    times = [c.worker_time for c in view.commits[-20:]]
    gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
    return median(gaps) or 0.05


def _command(plan: MttrPlan, data: Path, out: Path) -> list[str]:
    if plan.workload == "ddp":
        return train_command(data, 1_000_000)
    args = ["--mode", "elastic_fsdp", "--data", str(data), "--out", str(out / "loop"), "--steps", "1000000"]
    args += ["--dim", "64", "--micro-batch", "8"]  # train_char_lm.py's defaults: the ddp workload, sharded
    return [sys.executable, "-m", "slurm_elastic.showcase.bench.steploop", *args]


def measure(mode: Mode, plan: MttrPlan, data: Path, out: Path, log: Callable[[str], None]) -> ModeResult:
    rng = random.Random(plan.seed)
    config = JobConfig(
        nodes=plan.nodes,
        recovery=mode,
        max_restarts=0,
        heartbeat_interval_s=0.5,
        lease_timeout_s=10.0,
        progress_interval_s=1e9,
        checkpoint_dir=out / "checkpoints" if mode == "restart" else None,
        checkpoint_every=plan.checkpoint_every if mode == "restart" else 0,
    )
    job = LocalJob(_command(plan, data, out), config, log_dir=out / "logs", root=out).start()
    result = ModeResult(mode)
    kills: list[float] = []
    try:
        view = _wait(job, "warm-up", lambda v: v.last_step >= plan.warmup_steps and v.world == plan.nodes)
        result.step_time_s = _step_time(view)
        for i in range(plan.kills):
            victim = sorted(job.agents)[1 + i % (len(job.agents) - 1)]
            while job.agents[victim].poll() is not None:
                victim = sorted(n for n in job.agents if job.agents[n].poll() is None)[-1]
            target = job.view().last_step + 1
            _wait(job, "a fresh commit", lambda v, t=target: v.last_step >= t)  # type: ignore[misc]
            time.sleep(rng.uniform(0.0, result.step_time_s))
            killed_at = job.kill_node(victim)
            kills.append(killed_at)
            _wait(job, "recovery", lambda v, k=killed_at: recovery_after(k, v.commits).mttr_s is not None)  # type: ignore[misc]
            added = time.monotonic()
            job.add_node()
            _wait(job, "the replacement node", lambda v: v.world == plan.nodes)
            result.join_s.append(time.monotonic() - added)
            goal = job.view().last_step + plan.steps_between
            _wait(job, "steps after the join", lambda v, g=goal: v.last_step >= g)  # type: ignore[misc]
            rec = recovery_after(killed_at, job.view().commits)  # known for sure only now (a restart replays)
            log(f"  {mode}: kill {i + 1}/{plan.kills} of {victim}: recovered in {rec.mttr_s:.3f} s")
        commits = job.view().commits
    finally:
        job.stop()
    for killed_at in kills:
        rec = recovery_after(killed_at, commits)
        result.mttr_s.append(rec.mttr_s if rec.mttr_s is not None else float("nan"))
        result.lost_steps.append(rec.lost_steps)
    return result


def run(plan: MttrPlan, log: Callable[[str], None]) -> dict[str, Any]:
    started = time.monotonic()
    data = corpus()
    with tempfile.TemporaryDirectory(prefix="slurm-elastic-bench-") as tmp:
        log(f"bench mttr: {plan.kills} SIGKILLs of a node among {plan.nodes}, elastic recovery")
        elastic = measure("in_process", plan, data, Path(tmp) / "elastic", log)
        log(f"bench mttr: the same, checkpoint-restart (checkpoint every {plan.checkpoint_every} steps)")
        baseline = measure("restart", plan, data, Path(tmp) / "baseline", log)
    e_med, b_med = median(elastic.mttr_s), median(baseline.mttr_s)
    return {
        "nodes": plan.nodes,
        "kills": plan.kills,
        "workload": (
            "examples/train_char_lm.py, global batch 32, 4 micro-batches of 8 x 64 characters"
            if plan.workload == "ddp"
            else "the same char-LM sharded by FSDP2 (bench/steploop.py --mode elastic_fsdp --dim 64 --micro-batch 8)"
        ),
        "mode": plan.workload,
        "step_time_s": round(elastic.step_time_s or 0.0, 4),
        "checkpoint_every": plan.checkpoint_every,
        "elastic_mttr_s": [round(x, 4) for x in elastic.mttr_s],
        "baseline_mttr_s": [round(x, 4) for x in baseline.mttr_s],
        "elastic_mttr_s_median": round(e_med, 4) if e_med is not None else None,
        "baseline_mttr_s_median": round(b_med, 4) if b_med is not None else None,
        "ratio": round(e_med / b_med, 4) if e_med is not None and b_med else None,
        "elastic_join_s": [round(x, 3) for x in elastic.join_s],
        "elastic_join_s_median": round(median(elastic.join_s) or 0.0, 3),
        "lost_steps_elastic": sum(elastic.lost_steps),
        "lost_steps_baseline": sum(baseline.lost_steps),
        "lost_steps_elastic_per_kill": elastic.lost_steps,
        "lost_steps_baseline_per_kill": baseline.lost_steps,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
