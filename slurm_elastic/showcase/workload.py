"""The workload the demo and the benchmarks train: the elastic char-LM example on the stdlib's source."""

from __future__ import annotations

import fcntl
import sys
from pathlib import Path

from slurm_elastic.data import default_corpus, prepare_data
from slurm_elastic.errors import ElasticError
from slurm_elastic.jobdir import home

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str = "train_char_lm.py") -> Path:
    path = EXAMPLES / name
    if not path.is_file():
        raise ElasticError(f"{path} not found: the demo and benchmarks run from the source tree (pip install -e .)")
    return path


def corpus(max_bytes: int = 2_000_000) -> Path:
    """The standard library's own source as a character data set, prepared once and cached."""
    out = home() / "cache" / f"stdlib-{max_bytes}"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several demos at once must not prepare it twice
        if not (out / "meta.json").exists():
            prepare_data(default_corpus(), out, max_bytes=max_bytes)
    return out


def train_command(data: Path, steps: int, save: Path | None = None, *, script: str = "train_char_lm.py") -> list[str]:
    cmd = [sys.executable, str(example(script)), "--data", str(data), "--steps", str(steps)]
    return [*cmd, "--save", str(save)] if save else cmd
