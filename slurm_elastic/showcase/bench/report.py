"""`slurm-elastic bench report`: docs/benchmarks.md and its plots, from the JSON files the benchmarks wrote
(`make bench` runs them all first, on one machine).

Nothing here measures: every figure and point is read from a file that a benchmark command printed, and
each section names that command, the file's date and the machine the report was made on. A file that is
missing leaves its section saying which command writes it. Needs matplotlib (the `plots` extra).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_elastic.errors import ConfigError

__all__ = ["COORDINATOR_SIZES", "SOURCES", "write_report"]

COORDINATOR_SIZES = (256, 1024, 2048, 4096)  # nodes of one worker each
COORDINATOR_WIDE = 8  # workers per node of the last run: 4,096 nodes, every worker through its node's relay


@dataclass(frozen=True)
class Source:
    file: str
    command: str


SOURCES = {
    "mttr": Source("mttr.json", "slurm-elastic bench mttr --json"),
    "mttr_slurm": Source("mttr-slurm.json", "slurm-elastic bench mttr --slurm --kills 3 --json"),
    "notify": Source("notify.json", "slurm-elastic bench notify --json"),
    "overhead": Source("overhead.json", "slurm-elastic bench overhead --json"),
    "chaos": Source("chaos.json", "slurm-elastic chaos --json --losses"),
    "rendezvous": Source("rendezvous.json", "slurm-elastic bench rendezvous --json"),
    "simulate": Source("simulate.json", "slurm-elastic simulate --gpus 16384 --json --plot docs/bench/goodput.png"),
    **{
        f"coordinator_{n}": Source(f"coordinator-{n}.json", f"slurm-elastic bench coordinator --agents {n} --json")
        for n in COORDINATOR_SIZES
    },
    "coordinator_wide": Source(
        f"coordinator-4096x{COORDINATOR_WIDE}.json",
        f"slurm-elastic bench coordinator --agents 4096 --workers {COORDINATOR_WIDE} --json",
    ),
}


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("bench report needs matplotlib: pip install 'slurm-elastic[plots]'") from None
    return plt


class Report:
    def __init__(self, bench_dir: Path) -> None:
        self.dir = bench_dir
        self.plt = _pyplot()
        self.machine = f"{platform.node()} ({platform.machine()}, {_cores()} cores)"
        self.lines: list[str] = []

    def data(self, key: str) -> dict[str, Any] | None:
        path = self.dir / SOURCES[key].file
        return dict(json.loads(path.read_text())) if path.is_file() else None

    def stamp(self, *keys: str) -> str:
        """Where a section's figures come from: each file's command and date."""
        parts = []
        for key in keys:
            source, path = SOURCES[key], self.dir / SOURCES[key].file
            when = datetime.date.fromtimestamp(path.stat().st_mtime).isoformat() if path.is_file() else "not run"
            parts.append(f"`{source.command}` ({when})")
        return "From " + "; ".join(parts) + "."

    def missing(self, key: str) -> None:
        self.lines += [f"Not run yet: `{SOURCES[key].command} > docs/bench/{SOURCES[key].file}`.", ""]

    def figure(self, name: str, draw: Callable[[Any], None], keys: tuple[str, ...], width: float = 6.4) -> None:
        """One small PNG, stamped with the commands behind it, the machine and the date."""
        plt = self.plt
        fig, ax = plt.subplots(figsize=(width, 3.6), dpi=80)
        draw(ax)
        commands = "; ".join(SOURCES[k].command for k in keys)
        stamp = f"{commands}\n{self.machine}, {datetime.date.today().isoformat()}"
        fig.text(0.01, 0.01, stamp, fontsize=6, color="0.4", va="bottom")
        fig.tight_layout(rect=(0, 0.08, 1, 1))
        fig.savefig(self.dir / name)
        plt.close(fig)
        self.lines += [f"![{name}](bench/{name})", ""]


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _mttr(r: Report) -> None:
    r.lines += ["## Recovery after a node's SIGKILL", ""]
    local, slurm = r.data("mttr"), r.data("mttr_slurm")
    if local is None:
        r.missing("mttr")
        return
    r.lines += [
        "| run | elastic MTTR (median) | checkpoint-restart MTTR (median) | ratio | steps lost: elastic / restart |",
        "|---|---|---|---|---|",
        f"| local, {local['nodes']} nodes, {local['kills']} kills | {local['elastic_mttr_s_median']} s | "
        f"{local['baseline_mttr_s_median']} s | {local['ratio']} | {local['lost_steps_elastic']} / "
        f"{local['lost_steps_baseline']} |",
    ]
    if slurm is not None:
        r.lines.append(
            f"| Slurm, {slurm['nodes']} nodes, {slurm['kills']} kills (requeue) | {slurm['elastic_mttr_s_median']} s | "
            f"{slurm['baseline_mttr_s_median']} s | {slurm['ratio']} | {slurm['lost_steps_elastic']} / "
            f"{slurm['lost_steps_baseline']} |"
        )
    r.lines += ["", r.stamp("mttr", "mttr_slurm"), ""]
    groups = [("local\nelastic", local["elastic_mttr_s"]), ("local\nrestart", local["baseline_mttr_s"])]
    if slurm is not None:
        groups += [("Slurm\nelastic", slurm["elastic_mttr_s"]), ("Slurm\nrequeue", slurm["baseline_mttr_s"])]

    def draw(ax: Any) -> None:
        for i, (_, values) in enumerate(groups):
            ax.scatter([i] * len(values), values, alpha=0.7, color="C0" if i % 2 == 0 else "C3")
            ax.hlines(statistics.median(values), i - 0.25, i + 0.25, color="k")
        ax.set_xticks(range(len(groups)), labels=[g[0] for g in groups])
        ax.set_yscale("log")
        ax.set_ylabel("seconds from the kill to the next commit")
        ax.set_title("MTTR per kill (line: median)", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)

    r.figure("mttr.png", draw, ("mttr", "mttr_slurm"))


def _notify(r: Report) -> None:
    r.lines += ["## Slurm's node events to the job (admin hooks)", ""]
    n = r.data("notify")
    if n is None:
        r.missing("notify")
        return
    bare = n["without_hooks"]
    r.lines += [
        "| event | with hooks (median) | without hooks (median) |",
        "|---|---|---|",
        f"| drain to eviction | {n['drain_to_evict_s']} s | {bare['drain_to_evict_s']} s |",
        f"| shrink to eviction | {n['shrink_to_evict_s']} s | {bare['shrink_to_evict_s']} s |",
        "",
        r.stamp("notify"),
        "",
    ]


def _overhead(r: Report) -> None:
    r.lines += ["## The step against plain DDP and FSDP2", ""]
    o = r.data("overhead")
    if o is None:
        r.missing("overhead")
        return
    sizes = o["sizes"]
    r.lines += ["| size | parameters | float32 / DDP | float64 exact / DDP | FSDP2 / plain FSDP2 | peak RSS (FSDP2) |",
                "|---|---|---|---|---|---|"]  # fmt: skip
    for s in sizes:
        r.lines.append(f"| {s['name']} | {s['params']:,} | {s['ratio_fast']} | {s['ratio_exact']} | "
                       f"{s.get('ratio_fsdp', '-')} | {s.get('rss_ratio_fsdp', '-')} |")  # fmt: skip
    r.lines += ["", f"{o['ranks']} ranks on gloo. " + r.stamp("overhead"), ""]

    def draw(ax: Any) -> None:
        kinds = [("ratio_fast", "float32 / DDP"), ("ratio_exact", "float64 exact / DDP"), ("ratio_fsdp", "FSDP2")]
        width = 0.8 / len(kinds)
        for k, (field, label) in enumerate(kinds):
            xs = [i + (k - 1) * width for i in range(len(sizes))]
            ax.bar(xs, [s.get(field, 0) for s in sizes], width, label=label)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(sizes)), labels=[f"{s['name']}\n{s['params'] / 1e6:.1f} M" for s in sizes])
        ax.set_ylabel("step time / the plain torch step")
        ax.set_title("Step-time ratio by model size (1.0: as fast as plain torch)", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)

    r.figure("overhead.png", draw, ("overhead",))


def _chaos(r: Report) -> None:
    r.lines += ["## A faulted run against its reference", ""]
    c = r.data("chaos")
    if c is None or "losses" not in c:
        r.missing("chaos")
        return
    struck = [f for f in c["faults"] if f["fired"]]
    r.lines += [
        f"{len(struck)} faults (seed {c['seed']}) over {c['steps']} steps: {c['lost_committed_steps']} committed steps "
        f"lost, {c['duplicate_samples']} samples seen twice, {c['skipped_samples']} skipped; the final model is "
        f"within {c['max_param_rel_diff']:.2e} of the uninterrupted run's (bound {c['tolerance']:.0e}, "
        f"{c['reduce_dtype']}). " + r.stamp("chaos"),
        "",
    ]
    faulted, reference = c["losses"]["faulted"], c["losses"]["reference"]

    def draw(ax: Any) -> None:
        ax.plot(
            [p[0] for p in reference], [p[1] for p in reference], color="k", lw=2.5, alpha=0.3, label="uninterrupted"
        )
        ax.plot([p[0] for p in faulted], [p[1] for p in faulted], color="C3", lw=1, label="with faults")
        for f in struck:
            ax.axvline(f["step"], color="C0", lw=0.6, alpha=0.5)
        ax.set_xlabel("step (vertical lines: faults)")
        ax.set_ylabel("training loss")
        ax.set_title("Loss of the faulted run over its reference", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)

    r.figure("loss.png", draw, ("chaos",))


def _coordinator(r: Report) -> None:
    r.lines += ["## The coordinator under thousands of nodes", ""]
    keys = [*(f"coordinator_{n}" for n in COORDINATOR_SIZES), "coordinator_wide"]
    found = {key: d for key in keys if (d := r.data(key)) is not None}
    runs = [d for key, d in found.items() if key != "coordinator_wide"]  # the plot's: one worker per node
    if not runs:
        r.missing(f"coordinator_{COORDINATOR_SIZES[-1]}")
        return
    r.lines += [
        "| nodes | closed p50 / p99 | silent p50 / p99 | form p50 / p99 | CPU (one core) | RSS | frames/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in found.values():
        r.lines.append(
            f"| {d['agents']} x {d['workers_per_agent']} | {d['detect_closed_p50_s']} / {d['detect_closed_p99_s']} s | "
            f"{d['detect_silent_p50_s']} / {d['detect_silent_p99_s']} s | {d['form_p50_s']} / {d['form_p99_s']} s | "
            f"{d['coordinator_cpu_fraction']:.0%} | {d['coordinator_rss_mb']:.0f} MB | {d['frames_per_s']:,} |"
        )
    lease = runs[-1]["lease_s"]
    r.lines += [
        "",
        f"Targets at 4,096 nodes: closed p99 <= 2 s, silent p99 <= 2 leases ({2 * lease:g} s), CPU <= 50% of a core. "
        + r.stamp(*found),
        "",
    ]
    agents = [d["agents"] for d in runs]

    def draw(ax: Any) -> None:
        for field, label in (("detect_closed_p99_s", "closed p99"), ("detect_silent_p99_s", "silent p99"),
                             ("form_p99_s", "form p99")):  # fmt: skip
            ax.plot(agents, [d[field] for d in runs], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(agents, labels=[str(a) for a in agents])
        ax.minorticks_off()
        ax.set_xlabel("nodes (an agent and its workers each)")
        ax.set_ylabel("seconds")
        cpu = ax.twinx()
        cpu.plot(agents, [100 * d["coordinator_cpu_fraction"] for d in runs], color="k", ls="--", marker="s",
                 label="CPU % (right)")  # fmt: skip
        cpu.set_ylabel("coordinator CPU, % of one core")
        cpu.set_ylim(0, 100)
        lines = ax.get_legend_handles_labels()[0] + cpu.get_legend_handles_labels()[0]
        ax.legend(lines, [str(line.get_label()) for line in lines], fontsize=8, loc="center left")
        ax.set_title("Detection, formation and CPU against N", fontsize=10)
        ax.grid(True, alpha=0.3)

    r.figure("coordinator.png", draw, tuple(key for key in found if key != "coordinator_wide"))


def _rendezvous(r: Report) -> None:
    r.lines += ["## Rendezvous against world size", ""]
    d = r.data("rendezvous")
    if d is None:
        r.missing("rendezvous")
        return
    per_node = d.get("ranks_per_node")
    via = lambda x: f"relay per {per_node} ranks" if x.get("relay") else "direct"  # noqa: E731
    r.lines += [
        "| backend | store connections | ranks | store ops | form (s) | measured |",
        "|---|---|---|---|---|---|",
    ]
    for x in d["results"]:
        r.lines.append(f"| {x['backend']} | {via(x)} | {x['ranks']:,} | {x['store_ops']:,} | {x['form_s']} "
                       f"| {x['measured']} |")  # fmt: skip
    r.lines += ["", f"Target: NCCL at 16,384 ranks <= {d['target_nccl_16384_form_s']} s (the agents run relays: "
                f"{d.get('nccl_16384_form_s')} s; direct {d.get('nccl_16384_form_s_direct')} s). "
                + r.stamp("rendezvous"), ""]  # fmt: skip

    def draw(ax: Any) -> None:
        lines = [(b, relay) for b in ("nccl", "gloo") for relay in (False, True)]
        for k, (backend, relay) in enumerate(lines):
            rows = sorted((x for x in d["results"] if x["backend"] == backend and bool(x.get("relay")) == relay),
                          key=lambda x: x["ranks"])  # fmt: skip
            if not rows:
                continue
            ax.plot([x["ranks"] for x in rows], [x["form_s"] for x in rows], color=f"C{k}", lw=0.8,
                    ls="-" if relay else "--")  # fmt: skip
            for measured in (True, False):
                pts = [x for x in rows if x["measured"] is measured]
                if not pts:
                    continue
                ax.scatter([x["ranks"] for x in pts], [x["form_s"] for x in pts], color=f"C{k}",
                           facecolors=f"C{k}" if measured else "none",
                           label=f"{backend}, {via(rows[0])} ({'measured' if measured else 'projected'})")  # fmt: skip
        ax.axhline(d["target_nccl_16384_form_s"], color="k", ls=":", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks")
        ax.set_ylabel("seconds to form, store side")
        ax.set_title("Forming a generation's group through the coordinator's store", fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)

    r.figure("rendezvous.png", draw, ("rendezvous",))


def _goodput(r: Report) -> None:
    r.lines += ["## Goodput at scale (simulated with the figures above)", ""]
    s = r.data("simulate")
    if s is None:
        r.missing("simulate")
        return
    r.lines += ["| strategy | goodput | wasted GPU-hours | steps lost |", "|---|---|---|---|"]
    for name, x in s["strategies"].items():
        r.lines.append(f"| {name} | {x['goodput']:.2%} | {x['wasted_gpu_hours']:,.0f} | {x['lost_steps']:,} |")
    r.lines += ["", f"{s['gpus']:,} GPUs over {s['days']} days (docs/goodput.md). " + r.stamp("simulate"), ""]
    if (r.dir / "goodput.png").is_file():
        r.lines += ["![goodput.png](bench/goodput.png)", ""]


def write_report(bench_dir: Path, out: Path) -> Path:
    """docs/benchmarks.md (`out`) and its plots (in `bench_dir`), from the benchmarks' files there."""
    r = Report(bench_dir)
    r.lines += [
        "# Benchmarks",
        "",
        f"Made by `make bench` (every benchmark, then `slurm-elastic bench report`) on {r.machine}, "
        f"{datetime.date.today().isoformat()}. Each section names the command that wrote its figures; each plot "
        "carries the same stamp. Timings on a shared 2-core machine are noisy: compare ratios within one run.",
        "",
    ]
    for section in (_mttr, _chaos, _overhead, _notify, _coordinator, _rendezvous, _goodput):
        section(r)
    history = bench_dir / "history.md"
    if history.is_file():  # hand-kept: what earlier runs printed, under the generated sections
        r.lines += ["", "#" + history.read_text().strip(), ""]
    out.write_text("\n".join(r.lines))
    return out
