"""`slurm-elastic demo`: train the example on 4 local nodes, SIGKILL one node mid-run, add a node later,
and compare the result with an uninterrupted reference run of the same job."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slurm_elastic.config import JobConfig
from slurm_elastic.eventtypes import GenerationReady, MembershipChange
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance
from slurm_elastic.showcase.scenario import Action, ScenarioResult, run_scenario
from slurm_elastic.showcase.workload import corpus, train_command


@dataclass(frozen=True)
class DemoPlan:
    nodes: int = 4
    steps: int = 300
    kill_at: int = 60
    join_at: int = 80
    victim: str = "local2"
    reduce_dtype: str = "float32"


def _config(out: Path, plan: DemoPlan) -> JobConfig:
    return JobConfig(
        nodes=plan.nodes,
        max_restarts=0,
        heartbeat_interval_s=0.5,
        lease_timeout_s=5.0,
        progress_interval_s=5.0,
        ledger_dir=out / "ledger",
        reduce_dtype=plan.reduce_dtype,
    )


def _run(name: str, out: Path, plan: DemoPlan, actions: list[Action], data: Path) -> tuple[ScenarioResult, Path]:
    model = out / name / "model.pt"
    res = run_scenario(
        train_command(data, plan.steps, model),
        _config(out / name, plan),
        root=out / name,
        actions=actions,
        log_dir=out / name / "logs",
        timeout_s=600,
    )
    if not res.result.ok:
        raise SystemExit(f"slurm-elastic demo: the {name} run {res.result.phase}: {res.result.reason}")
    return res, model


def run_demo(plan: DemoPlan, workdir: Path | None = None) -> dict[str, Any]:
    started = time.monotonic()
    out = workdir or Path(tempfile.mkdtemp(prefix="slurm-elastic-demo-"))
    data = corpus()
    print(f"demo: reference run, {plan.nodes} nodes, {plan.steps} steps, no faults", file=sys.stderr)
    ref, ref_model = _run("reference", out, plan, [], data)
    print(
        f"demo: elastic run, SIGKILL {plan.victim} at step {plan.kill_at}, a new node at step {plan.join_at}",
        file=sys.stderr,
    )
    actions = [Action(plan.kill_at, "kill_node", plan.victim, delay_s=0.02), Action(plan.join_at, "add_node")]
    res, model = _run("elastic", out, plan, actions, data)
    ready = res.of(GenerationReady)
    changes = res.of(MembershipChange)
    summary = {
        "steps": res.ledger.committed_steps if res.ledger else 0,
        "failures": len(res.recoveries),
        "joins": sum(len(e.joined) for e in changes if e.cause != "start"),
        "mttr_s": [round(r.mttr_s, 4) if r.mttr_s is not None else None for r in res.recoveries],
        "lost_committed_steps": sum(e.lost_committed_steps for e in ready),
        "duplicate_samples": res.ledger.duplicate_samples if res.ledger else None,
        "skipped_samples": res.ledger.skipped_samples if res.ledger else None,
        "final_loss": round(res.commits[-1].loss, 6) if res.commits else None,
        "reference_final_loss": round(ref.commits[-1].loss, 6) if ref.commits else None,
        "max_param_rel_diff": max_param_rel_diff(torch.load(model), torch.load(ref_model)),
        "reduce_dtype": plan.reduce_dtype,
        "tolerance": tolerance(plan.reduce_dtype, plan.steps),
        "world_sizes": [e.world for e in changes],
        "generations": len(changes),
        "elapsed_s": round(time.monotonic() - started, 1),
        "workdir": str(out),
    }
    if workdir is None:
        shutil.rmtree(out, ignore_errors=True)
        summary["workdir"] = None
    return summary


def render(summary: dict[str, Any]) -> str:
    mttr = ", ".join(f"{m:.3f} s" for m in summary["mttr_s"] if m is not None)
    ok = summary["max_param_rel_diff"] <= summary["tolerance"]
    ok = ok and summary["duplicate_samples"] == 0 == summary["skipped_samples"]
    same = "the same bits" if summary["reduce_dtype"] == "float64" else f"within its {summary['tolerance']:g} bound"
    lines = [
        "slurm-elastic demo",
        f"  trained {summary['steps']} steps; world sizes over time: {' -> '.join(map(str, summary['world_sizes']))}",
        f"  node failures: {summary['failures']}, recovered in {mttr}",
        f"  nodes joined: {summary['joins']}, committed steps lost: {summary['lost_committed_steps']}",
        f"  samples seen twice: {summary['duplicate_samples']}, skipped: {summary['skipped_samples']}",
        f"  final loss {summary['final_loss']:.4f} (uninterrupted reference: {summary['reference_final_loss']:.4f})",
        f"  largest relative parameter difference from the reference: {summary['max_param_rel_diff']:.3g}"
        f" (gradients summed in {summary['reduce_dtype']})",
        f"  verdict: {f'same model ({same}), every sample exactly once' if ok else 'DIFFERENT from the reference'}"
        f" ({summary['elapsed_s']} s)",
    ]
    return "\n".join(lines)


def main(as_json: bool, plan: DemoPlan | None = None, workdir: Path | None = None) -> int:
    summary = run_demo(plan or DemoPlan(), workdir)
    print(json.dumps(summary) if as_json else render(summary))
    return 0
