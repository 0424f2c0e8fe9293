"""`slurm-elastic bench overhead`: what one training step costs under ElasticJob against plain torch DDP.

The same workload (`steploop.py`: the char-LM example's model, the same global batch and micro-batch)
runs on 4 local ranks as (a) plain DDP under torchrun, (b) ElasticJob summing in float32 and (c) in
float64 (exact mode), and with the model sharded by FSDP2 as (d) plain FSDP2 under torchrun and (e)
ElasticJob with its second holder of every shard (docs/fsdp.md), each as a separate job, at three model
sizes. Each job reports the time every step starts on rank 0 and every rank's peak resident memory (and,
sharded, its optimizer state's bytes); the steady-state step time is the median gap between step starts
after the first `warmup` steps. Modes alternate within each size, a to e and then e to a, so that a slow
moment of the machine falls on all of them and a steady drift favours none; ratios come from this
one run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_elastic.config import JobConfig
from slurm_elastic.errors import ElasticError
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.showcase.metrics import median
from slurm_elastic.showcase.workload import corpus
from slurm_elastic.worker.sharded import checksum

MODES = ("ddp", "float32", "float64", "fsdp", "elastic_fsdp")
WORKLOADS = {"all": MODES, "ddp": MODES[:3], "fsdp": MODES[3:]}  # the modes each comparison needs


@dataclass(frozen=True)
class Size:
    name: str
    dim: int
    layers: int
    steps: int


SIZES = (Size("small", 128, 2, 40), Size("medium", 256, 4, 30), Size("large", 512, 7, 20))


@dataclass(frozen=True)
class OverheadPlan:
    ranks: int = 4
    sizes: tuple[Size, ...] = SIZES
    warmup: int = 5
    repeats: int = 2
    modes: tuple[str, ...] = MODES
    global_batch: int = 32
    micro_batch: int = 4


@dataclass(frozen=True)
class Run:
    step_s: float
    peak_rss_mb: float  # the largest of the ranks
    params: int
    opt_fraction: float | None = None  # the largest rank's optimizer state over the full state (sharded modes)


def _loop_args(plan: OverheadPlan, size: Size, data: Path, out: Path, mode: str) -> list[str]:
    return [
        "-m", "slurm_elastic.showcase.bench.steploop", "--mode", mode, "--data", str(data), "--out", str(out),
        "--steps", str(size.steps), "--dim", str(size.dim), "--layers", str(size.layers),
        "--global-batch", str(plan.global_batch), "--micro-batch", str(plan.micro_batch),
    ]  # fmt: skip


def _collect(out: Path, plan: OverheadPlan) -> Run:
    records = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    if len(records) != plan.ranks:
        raise ElasticError(f"bench overhead: {len(records)} of {plan.ranks} ranks reported in {out}")
    starts = next(r["step_starts"] for r in records if r["rank"] == 0)
    gaps = [b - a for a, b in zip(starts[plan.warmup :], starts[plan.warmup + 1 :], strict=False)]
    step_s = median(gaps)
    if step_s is None:
        raise ElasticError(f"bench overhead: no steady-state steps in {out} (steps <= warmup {plan.warmup})")
    full = max(r.get("opt_full_bytes", 0) for r in records)
    fraction = max(r["opt_bytes"] for r in records) / full if full else None
    return Run(step_s, max(r["peak_rss_mb"] for r in records), records[0]["params"], fraction)


def _run_torchrun(plan: OverheadPlan, size: Size, data: Path, out: Path, mode: str, retried: list[str] | None) -> Run:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={plan.ranks}",
        *_loop_args(plan, size, data, out, mode),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 and retried is not None:
        # The baseline is plain torch: a crash of its own (seen once: a rank's "terminate called without an
        # active exception") is retried once, and said in the result; ours are never retried.
        first = next((line for line in done.stderr.splitlines() if line.strip()), "")
        retried.append(f"{size.name} {mode}: exit {done.returncode}: {first[:200]}")
        shutil.rmtree(out, ignore_errors=True)
        return _run_torchrun(plan, size, data, out, mode, None)
    if done.returncode != 0:
        # torchrun's own summary alone fills 2 000 characters; the failing rank's message comes before it
        raise ElasticError(f"bench overhead: torchrun failed ({done.returncode}): {done.stderr[-8000:]}")
    return _collect(out, plan)


def _run_elastic(plan: OverheadPlan, size: Size, data: Path, out: Path, dtype: str, mode: str = "elastic") -> Run:
    config = JobConfig(
        nodes=plan.ranks,
        max_restarts=0,
        progress_interval_s=1e9,
        reduce_dtype=dtype,
    )
    argv = [sys.executable, *_loop_args(plan, size, data, out, mode)]
    job = LocalJob(argv, config, root=out, log_dir=out / "logs").start()  # not into the bench's JSON on stdout
    try:
        result = job.wait(timeout=1800)
    finally:
        job.stop()
    if not result.ok:
        raise ElasticError(f"bench overhead: the {dtype} job {result.phase}: {result.reason}")
    return _collect(out, plan)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def _measure(plan: OverheadPlan, size: Size, data: Path, out: Path, mode: str, retried: list[str]) -> Run:
    if mode in ("ddp", "fsdp"):
        return _run_torchrun(plan, size, data, out, mode, retried)
    if mode == "elastic_fsdp":
        return _run_elastic(plan, size, data, out, "float32", mode)
    return _run_elastic(plan, size, data, out, mode)


def run_order(modes: tuple[str, ...], repeat: int) -> tuple[str, ...]:
    """The modes in the order repeat `repeat` runs them: forward, then backward (each mode's runs sit as
    often before a compared mode as after it, so a machine that speeds up or slows down steadily favours none)."""
    return modes if repeat % 2 == 0 else modes[::-1]


def _fraction(runs: list[Run]) -> float | None:
    found = [r.opt_fraction for r in runs if r.opt_fraction is not None]
    return round(max(found), 4) if found else None


def _summary(size: Size, runs: dict[str, list[Run]]) -> dict[str, Any]:
    """The size's figures for the modes that ran (the replicated ones, the sharded ones, or both)."""
    ran = [m for m in MODES if runs.get(m)]
    step = {m: median([r.step_s for r in runs[m]]) or 0.0 for m in ran}
    rss = {m: max(r.peak_rss_mb for r in runs[m]) for m in ran}
    out: dict[str, Any] = {"name": size.name, "params": runs[ran[0]][0].params, "dim": size.dim, "layers": size.layers}
    if "ddp" in ran:
        out |= {
            "ddp_step_s": round(step["ddp"], 4),
            "fast_step_s": round(step["float32"], 4),
            "exact_step_s": round(step["float64"], 4),
            "ratio_fast": _ratio(step["float32"], step["ddp"]),
            "ratio_exact": _ratio(step["float64"], step["ddp"]),
            "ddp_peak_rss_mb": rss["ddp"],
            "fast_peak_rss_mb": rss["float32"],
            "exact_peak_rss_mb": rss["float64"],
            "rss_ratio_fast": _ratio(rss["float32"], rss["ddp"]),
            "rss_ratio_exact": _ratio(rss["float64"], rss["ddp"]),
        }
    if "fsdp" in ran:
        out |= {
            "fsdp_step_s": round(step["fsdp"], 4),
            "elastic_fsdp_step_s": round(step["elastic_fsdp"], 4),
            "ratio_fsdp": _ratio(step["elastic_fsdp"], step["fsdp"]),
            "fsdp_peak_rss_mb": rss["fsdp"],
            "elastic_fsdp_peak_rss_mb": rss["elastic_fsdp"],
            "rss_ratio_fsdp": _ratio(rss["elastic_fsdp"], rss["fsdp"]),
            "optimizer_state_fraction_fsdp": _fraction(runs["elastic_fsdp"]),
            "optimizer_state_fraction_plain_fsdp": _fraction(runs["fsdp"]),
        }
    names = dict(zip(MODES, ("ddp", "fast", "exact", "fsdp", "elastic_fsdp"), strict=True))
    return out | {f"{names[m]}_step_s_runs": [round(r.step_s, 4) for r in runs[m]] for m in ran}


def run(plan: OverheadPlan, log: Callable[[str], None]) -> dict[str, Any]:
    started = time.monotonic()
    data = corpus()
    sizes = []
    retried: list[str] = []
    with tempfile.TemporaryDirectory(prefix="slurm-elastic-overhead-") as tmp:
        for size in plan.sizes:
            runs: dict[str, list[Run]] = {mode: [] for mode in plan.modes}
            for rep in range(plan.repeats):
                for mode in run_order(plan.modes, rep):
                    r = _measure(plan, size, data, Path(tmp) / f"{size.name}-{mode}-{rep}", mode, retried)
                    runs[mode].append(r)
                    log(f"  {size.name} ({r.params / 1e6:.1f} M) {mode}: {r.step_s:.4f} s/step, {r.peak_rss_mb} MB")
            sizes.append(_summary(size, runs))
    ratios = [s["ratio_fast"] for s in sizes if s.get("ratio_fast") is not None]
    fsdp_ratios = [s["ratio_fsdp"] for s in sizes if s.get("ratio_fsdp") is not None]
    rss_ratios = [s["rss_ratio_fast"] for s in sizes if s.get("rss_ratio_fast") is not None]
    return {
        "ranks": plan.ranks,
        "workload": (
            f"char-LM (examples/char_model.py), global batch {plan.global_batch}, micro-batch {plan.micro_batch} "
            f"x 64 characters, AdamW, gloo; steady state after {plan.warmup} steps; median of {plan.repeats} runs"
        ),
        "sizes": sizes,
        "max_ratio_fast": max(ratios, default=None),
        "max_rss_ratio_fast": max(rss_ratios, default=None),
        "max_ratio_fsdp": max(fsdp_ratios, default=None),
        "baseline_retries": retried,  # plain torch runs that crashed once and were run again
        "fsdp_checksum": checksum.ENGINE,  # the CRC the elastic FSDP2 runs used (zlib-ng: the `fast` extra)
        "elapsed_s": round(time.monotonic() - started, 1),
    }
