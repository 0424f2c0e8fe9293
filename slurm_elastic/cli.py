"""The `slurm-elastic` command line."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    raise SystemExit("slurm-elastic: not wired yet")
