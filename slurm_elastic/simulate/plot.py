"""Goodput against cluster size, one line per strategy: the figure `slurm-elastic simulate --plot` writes,
stamped with the command that made it, the machine and the date. Needs matplotlib (the `plots` extra)."""

from __future__ import annotations

import datetime
import platform
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_elastic.errors import ConfigError

__all__ = ["plot_goodput"]


def plot_goodput(path: Path, by_size: Mapping[int, Mapping[str, float]], command: Sequence[str], title: str) -> None:
    """`by_size`: GPUs -> strategy -> mean goodput. Written as a small PNG (or SVG, by `path`'s suffix)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'slurm-elastic[plots]'") from None
    sizes = sorted(by_size)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=90)
    for strategy in by_size[sizes[0]]:
        ax.plot(sizes, [100 * by_size[n][strategy] for n in sizes], marker="o", label=strategy)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, labels=[str(n) for n in sizes])
    ax.minorticks_off()
    ax.set_xlabel("GPUs")
    ax.set_ylabel("goodput (% of wall time training)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    stamp = f"{shlex.join(command)}\n{platform.node()} ({platform.machine()}), {datetime.date.today().isoformat()}"
    fig.text(0.01, 0.01, stamp, fontsize=6, color="0.4", va="bottom")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path)
    plt.close(fig)
