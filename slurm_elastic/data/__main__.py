"""`python -m slurm_elastic.data prepare-data ...`: the data commands without the top-level CLI."""

from __future__ import annotations

import argparse

from slurm_elastic.data import cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_elastic.data")
    subparsers = parser.add_subparsers(dest="command", required=True)
    cli.add_parser(subparsers)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
