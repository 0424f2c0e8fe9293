"""Our measured figures for a simulation, read from the JSON files the benchmarks print; a missing file or
figure is one error that names it and the command that writes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurm_elastic.errors import ConfigError
from slurm_elastic.simulate.scenario import Measured

__all__ = ["BENCH_DIR", "INPUTS", "read_measured"]

BENCH_DIR = Path("docs") / "bench"
# figure -> (file in the bench directory, its key, the command that writes the file)
INPUTS = {
    "mttr_s": ("mttr.json", "elastic_mttr_s_median", "slurm-elastic bench mttr --json"),
    "join_s": ("mttr.json", "elastic_join_s_median", "slurm-elastic bench mttr --json"),
    "requeue_s": ("mttr-slurm.json", "baseline_mttr_s_median", "slurm-elastic bench mttr --slurm --json"),
    "step_ratio": ("overhead.json", "max_ratio_fast", "slurm-elastic bench overhead --json"),
}


def read_measured(directory: Path) -> Measured:
    figures: dict[str, float] = {}
    sources: dict[str, str] = {}
    loaded: dict[str, dict[str, Any]] = {}
    for figure, (name, key, command) in INPUTS.items():
        path = directory / name
        if name not in loaded:
            loaded[name] = _load(path, command)
        value = loaded[name].get(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            fix = f"write the file with `{command} > {path}`"
            raise ConfigError(f"{path}: {key}={value!r} is not a positive number; {fix}")
        figures[figure] = float(value)
        sources[figure] = f"{_shown(path)}:{key}"
    return Measured(**figures, sources=sources)


def _shown(path: Path) -> str:
    """`path` as the JSON records it: relative to the working directory when inside it (a checkout's
    docs/bench), so that a committed file names no machine's paths."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _load(path: Path, command: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} is missing: write it with `{command} > {path}`") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc}): write it again with `{command} > {path}`") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds {type(data).__name__}, not the JSON object `{command}` prints")
    return data
