"""`slurm-elastic demo`: kill a node mid-run, add one later, compare with an uninterrupted run."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="the elastic demo on 4 local nodes (or --slurm)", description=__doc__)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--slurm", action="store_true", help="run through elastic_core.sbatch on the local Slurm cluster")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR", help="keep logs, events and models in DIR")
    p.add_argument(
        "--reduce-dtype",
        choices=("float32", "bfloat16", "float64"),
        default="float32",
        help="how gradients are summed (float64: exact, the same bits as the reference); default float32",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from slurm_elastic.logs import configure_logging

    configure_logging("json" if args.json else "console", "WARNING")
    if args.slurm:
        from slurm_elastic.showcase.slurmdemo import main as slurm_main

        return slurm_main(args.json, args.keep, args.reduce_dtype)
    from slurm_elastic.showcase.demo import DemoPlan, main

    return main(args.json, DemoPlan(reduce_dtype=args.reduce_dtype), workdir=args.keep)
