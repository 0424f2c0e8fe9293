"""`slurm-elastic chaos`: a seeded run of mixed faults on local nodes, judged against an uninterrupted run.

The plan (`decide.chaos.plan_chaos`) is fixed by the seed. Faults inside a training process (a SIGKILL in a
phase of a step, a hang, a kill while a generation forms or while a joiner receives the state) travel in
the fault plan the workers read; faults of whole nodes (a node's SIGKILL, a join, a drain) are carried out
here when the job reaches their step. Each fault is waited out (the job commits a step in a new generation)
before the next, except the recovery faults, which are meant to strike during the next fault's recovery.
The verdict: the same model as the uninterrupted run (within the reduce dtype's bound), no sample seen
twice or skipped, no committed step lost.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from slurm_elastic.config import JobConfig
from slurm_elastic.decide.chaos import ChaosFault, plan_chaos, steps_needed
from slurm_elastic.errors import ElasticError
from slurm_elastic.eventtypes import CheckpointFallback, GenerationReady, of_kind
from slurm_elastic.faults import FaultPlan
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.ledger import analyze
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance
from slurm_elastic.showcase.workload import corpus, example
from slurm_elastic.waiting import wait_until

IN_JOB = ("worker_kill", "hang", "recovery_fault", "transfer_fault")  # carried in the workers' fault plan
PAUSE_S = 0.05  # after each step, so that faults land in the steps the plan names


def fault_plan(plan: list[ChaosFault]) -> FaultPlan:
    """The faults that strike inside training processes, for their environment."""
    faults = FaultPlan()
    for f in plan:
        if f.node is None or f.kind not in IN_JOB:
            continue  # done from outside the training processes
        if f.kind == "worker_kill":
            faults = faults.add(node=f.node, step=f.step + 1, phase=f.phase, action="kill")
        elif f.kind == "hang":
            faults = faults.add(node=f.node, step=f.step + 1, phase=f.phase, action="stop")
        elif f.kind == "recovery_fault":
            faults = faults.add(node=f.node, step=f.step + 1, phase="recovery", action="kill", after=True)
        elif f.kind == "transfer_fault":
            faults = faults.add(node=f.node, step=f.step + 1, phase="transfer", action="kill_node", after=True)
    return faults


def fired(plan: list[ChaosFault], in_job: FaultPlan) -> list[bool]:
    """Which faults of `plan` fired: those inside training processes by their record; the rest always do."""
    flags = iter(in_job.fired())
    return [next(flags) if f.node is not None and f.kind in IN_JOB else True for f in plan]


def command(
    data: Path, steps: int, model: Path, hold: Path, pause: float = PAUSE_S, flag: str = "--hold-file"
) -> list[str]:
    """The elastic example, paced (`--pause`) and held while a joiner starts (`--hold-file`), or bounded
    to the steps the file names (`flag="--until-file"`)."""
    paced = Path(__file__).resolve().parents[2] / "tests" / "integration" / "train_slow.py"
    if not paced.is_file():
        raise ElasticError(f"{paced} not found: chaos runs from the source tree (pip install -e .)")
    return [sys.executable, str(paced), "--data", str(data), "--steps", str(steps), "--save", str(model),
            "--pause", str(pause), flag, str(hold)]  # fmt: skip


def reference(data: Path, steps: int, out: Path, reduce_dtype: str) -> dict[str, torch.Tensor]:
    """The uninterrupted run: exact mode gives the same bits at any world size, so one process suffices."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_ELASTIC_")}
    env |= {"OMP_NUM_THREADS": "1", "SLURM_ELASTIC_REDUCE_DTYPE": reduce_dtype}
    cmd = [sys.executable, str(example()), "--data", str(data), "--steps", str(steps), "--save", str(out)]
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=3600)
    state: dict[str, torch.Tensor] = torch.load(out)
    return state


def reference_losses(data: Path, steps: int, out: Path, reduce_dtype: str) -> list[tuple[int, float, int]]:
    """Each committed step's loss in an uninterrupted one-node run of the same example and steps."""
    config = JobConfig(nodes=1, progress_interval_s=1e9, reduce_dtype=reduce_dtype)
    cmd = [sys.executable, str(example()), "--data", str(data), "--steps", str(steps)]
    job = LocalJob(cmd, config, root=out, log_dir=out / "logs").start()
    try:
        result = job.wait(timeout=1800)
        commits = job.view().commits
    finally:
        job.stop()
    if not result.ok:
        raise ElasticError(f"chaos: the uninterrupted run {result.phase}: {result.reason}")
    return [(c.step, c.loss, c.world) for c in commits]


class _Runner:
    def __init__(self, job: LocalJob, hold: Path, log: Callable[[str], None]) -> None:
        self.job = job
        self.hold = hold
        self.log = log

    def events(self, kind: str) -> list[dict[str, Any]]:
        assert self.job.coordinator is not None
        return [e for e in self.job.coordinator.coordinator.events.all() if e["event"] == kind]

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 180.0) -> None:
        wait_until(predicate, timeout=timeout, what=f"{what} (chaos)", give_up=self.job.ended)

    def registered_nodes(self) -> set[str]:
        assert self.job.coordinator is not None
        coord = self.job.coordinator.coordinator
        return self.job.coordinator.call(lambda: {p.node for p in coord.workers.values()})

    def member_nodes(self) -> set[str]:
        assert self.job.coordinator is not None
        coord = self.job.coordinator.coordinator
        return self.job.coordinator.call(
            lambda: {coord.workers[w].node for w in coord.state.members if w in coord.workers}
        )

    def apply(self, fault: ChaosFault) -> None:
        job = self.job
        self.wait(f"step {fault.step}", lambda: job.view().last_step >= fault.step)
        if fault.kind == "join":
            self.hold.touch()  # no step starts until the newcomer has registered: it joins at the next boundary
            try:
                name = job.add_node()
                self.log(f"chaos: step {fault.step}: {name} joins")
                self.wait(f"{name} to register", lambda: name in self.registered_nodes())
            finally:
                self.hold.unlink(missing_ok=True)
            self.wait(f"{name} to join", lambda: name in self.member_nodes())
            return
        self.log(
            f"chaos: step {fault.step}: {fault.kind} of {fault.node}" + (f" in {fault.phase}" if fault.phase else "")
        )
        if fault.kind == "node_loss":
            job.kill_node(fault.node or "")
        elif fault.kind == "drain":
            assert job.coordinator is not None
            job.coordinator.drain([fault.node or ""], "boundary", "chaos")
        if fault.kind == "recovery_fault":
            return  # strikes during the next fault's recovery
        self.wait(
            f"{fault.node} to be out after its {fault.kind}",
            lambda: fault.node not in self.member_nodes() and job.view().last_step > fault.step,
        )


def run_chaos(
    seed: int,
    faults: int,
    *,
    nodes: int = 4,
    reduce_dtype: str = "float64",
    losses: bool = False,
    log: Callable[[str], None],
) -> dict[str, Any]:
    started = time.monotonic()
    plan = plan_chaos(seed, faults, nodes=nodes)
    steps = steps_needed(plan)
    data = corpus()
    with tempfile.TemporaryDirectory(prefix="slurm-elastic-chaos-") as tmp:
        out = Path(tmp)
        log(f"chaos: seed {seed}, {faults} faults over {steps} steps on {nodes} local nodes ({reduce_dtype})")
        config = JobConfig(
            nodes=nodes, heartbeat_interval_s=0.2, lease_timeout_s=3.0, hang_timeout_s=3.0, max_restarts=0,
            progress_interval_s=1e9, ledger_dir=out / "ledger", reduce_dtype=reduce_dtype,
        )  # fmt: skip
        model = out / "model.pt"
        hold = out / "hold"
        (out / "fired").mkdir()
        in_job = fault_plan(plan).recorded_in(out / "fired")
        job = LocalJob(command(data, steps, model, hold), config, faults=in_job, root=out, log_dir=out / "logs").start()
        runner = _Runner(job, hold, log)
        try:
            for fault in plan:
                runner.apply(fault)
            result = job.wait(timeout=1800)
            curve = [(c.step, c.loss, c.world) for c in job.view().commits]
            ready = runner.events("generation_ready")
            fallbacks = runner.events("checkpoint_fallback")
        finally:
            job.stop()
        if not result.ok:
            raise ElasticError(f"chaos: the job {result.phase}: {result.reason}")
        summary = verdict(data, steps, model, out, reduce_dtype, ready + fallbacks)
        struck = fired(plan, in_job)
        if losses:  # the loss of each committed step, beside the uninterrupted run's (bench report's plot)
            log("chaos: the uninterrupted run's losses, on one node")
            summary["losses"] = {
                "faulted": curve,
                "reference": reference_losses(data, steps, out / "ref", reduce_dtype),
            }
    faults_fired = [
        {"step": f.step, "kind": f.kind, "node": f.node, "phase": f.phase, "fired": hit}
        for f, hit in zip(plan, struck, strict=True)
    ]
    return {"seed": seed, "faults": faults_fired, **summary, "elapsed_s": round(time.monotonic() - started, 1)}


def verdict(
    data: Path, steps: int, model: Path, out: Path, reduce_dtype: str, events: list[dict[str, Any]]
) -> dict[str, Any]:
    """The chaos run's verdict against an uninterrupted run: the model saved at `model`, the ledger under
    `out/ledger`, and the job's `generation_ready` and `checkpoint_fallback` events (the steps lost)."""
    expected = reference(data, steps, out / "reference.pt", reduce_dtype)
    ledger = analyze(out / "ledger")
    diff = max_param_rel_diff(torch.load(model), expected)
    ready = of_kind(events, GenerationReady)
    lost = sum(e.lost_committed_steps for e in ready)
    lost += sum(e.replayed_steps for e in of_kind(events, CheckpointFallback))
    bound = tolerance(reduce_dtype, steps)
    return {
        "steps": ledger.committed_steps,
        "generations": len(ready),
        "lost_committed_steps": lost,
        "duplicate_samples": ledger.duplicate_samples,
        "skipped_samples": ledger.skipped_samples,
        "max_param_rel_diff": diff,
        "tolerance": bound,
        "reduce_dtype": reduce_dtype,
        "ok": lost == 0 and ledger.duplicate_samples == 0 == ledger.skipped_samples and diff <= bound,
    }
