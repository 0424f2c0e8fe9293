"""`slurm-elastic simulate`: a long run at scale under failures, repairs and preemption, simulated for
checkpoint-restart, checkpointless and elastic recovery; our costs come from the benchmarks' JSON files."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from slurm_elastic.commands.common import fail, print_result
from slurm_elastic.errors import ConfigError
from slurm_elastic.simulate import Measured, Outcome, Scenario, report, simulate
from slurm_elastic.simulate.inputs import read_measured
from slurm_elastic.simulate.plot import plot_goodput

REPO_BENCH = Path(__file__).resolve().parents[2] / "docs" / "bench"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="goodput at scale per recovery strategy (discrete-event)", description=__doc__)
    p.add_argument("--inputs", type=Path, default=REPO_BENCH, help="directory of the benchmarks' JSON files")
    p.add_argument("--seed", type=int, default=0, help="the first run's timeline (the same seed, the same run)")
    p.add_argument("--runs", type=int, default=10, help="runs with seeds seed.. seed+runs-1, averaged")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", type=Path, default=None, help="also write goodput against GPUs (16 up to --gpus) here")
    group = p.add_argument_group("scenario")
    for name, field in Scenario.model_fields.items():
        help_text = (field.description + "; " if field.description else "") + f"default: {field.default}"
        group.add_argument("--" + name.replace("_", "-"), dest=f"sc_{name}", metavar="VALUE", help=help_text)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.runs < 1:
        return fail(f"--runs {args.runs}: need at least 1 run")
    given = {k[3:]: v for k, v in vars(args).items() if k.startswith("sc_") and v is not None}
    try:
        scenario = Scenario.model_validate(given)
        measured = read_measured(args.inputs)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        if not where:  # a check across fields: its message names the values
            return fail(f"the scenario: {first['msg'].removeprefix('Value error, ')}")
        return fail(f"--{where.replace('_', '-')} {given.get(where)}: {first['msg']}")
    except ConfigError as exc:
        return fail(str(exc))
    runs = _runs(scenario, measured, args)
    result = report(scenario, measured, args.seed, runs[0])
    result["runs"] = args.runs
    result["strategies"] = {name: _mean([r[name].as_json() for r in runs]) for name in runs[0]}
    if args.plot is not None:
        sizes = _sizes(scenario)
        result["by_gpus"] = {n: _goodput(scenario.model_copy(update={"gpus": n}), measured, args) for n in sizes}
        title = f"{scenario.days:g} days, {scenario.failures_per_gpu_hour:.3g} failures per GPU-hour, {args.runs} runs"
        try:
            plot_goodput(args.plot, result["by_gpus"], ["slurm-elastic", *sys.argv[1:]], title)
        except (ConfigError, OSError) as exc:
            return fail(f"--plot {args.plot}: {exc}")
    print_result(result, args.json)
    return 0


def _sizes(scenario: Scenario) -> list[int]:
    """16 GPUs, then 4 times as many, up to and including the scenario's own size."""
    sizes, n = [], max(16, scenario.gpus_per_node)
    while n < scenario.gpus:
        sizes.append(n - n % scenario.gpus_per_node)
        n *= 4
    return [*sizes, scenario.gpus]


def _runs(scenario: Scenario, measured: Measured, args: argparse.Namespace) -> list[dict[str, Outcome]]:
    """Every strategy on the timelines of seeds --seed .. --seed + --runs - 1."""
    return [simulate(scenario, measured, seed) for seed in range(args.seed, args.seed + args.runs)]


def _goodput(scenario: Scenario, measured: Measured, args: argparse.Namespace) -> dict[str, float]:
    runs = _runs(scenario, measured, args)
    return {name: round(statistics.fmean(r[name].goodput for r in runs), 5) for name in runs[0]}


def _mean(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in rows[0].items():
        values = [row[key] for row in rows]
        if value is None or isinstance(value, str):
            out[key] = value
        else:
            out[key] = round(statistics.fmean(values), 5 if key == "goodput" else 1)
    if len(rows) > 1:
        out["goodput_min"] = min(row["goodput"] for row in rows)
    return out
