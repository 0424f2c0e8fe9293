"""`slurm-elastic chaos`: a seeded run of mixed faults, ending with the model of an uninterrupted run."""

from __future__ import annotations

import argparse
import sys

from slurm_elastic.commands.common import fail, print_result


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("chaos", help="train under a seeded mix of faults and check the result", description=__doc__)
    p.add_argument("--seed", type=int, default=0, help="the plan of faults (the same seed, the same plan)")
    p.add_argument("--faults", type=int, default=20, help="how many faults")
    p.add_argument("--nodes", type=int, default=4, help="local nodes at the start (--slurm: the cluster's nodes)")
    p.add_argument(
        "--reduce-dtype", choices=("float64", "float32", "bfloat16"), default="float64",
        help="how gradients are summed; float64 (exact) makes the verdict the same bits",
    )  # fmt: skip
    p.add_argument("--slurm", action="store_true", help="on the local Slurm cluster (see docs/operator-guide.md)")
    p.add_argument("--json", action="store_true", help="print one JSON summary")
    p.add_argument("--losses", action="store_true", help="add each step's loss, and an uninterrupted run's")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.faults < 1 or args.nodes < 3:
        return fail(f"--faults {args.faults} --nodes {args.nodes}: need at least 1 fault and 3 nodes")
    from slurm_elastic.logs import configure_logging

    configure_logging("json" if args.json else "console", "WARNING")
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.slurm and args.losses:
        return fail("--slurm --losses: the loss curves come from a local run; leave out --slurm")
    if args.slurm:
        from slurm_elastic.showcase.chaos_slurm import run_chaos_slurm

        summary = run_chaos_slurm(args.seed, args.faults, reduce_dtype=args.reduce_dtype, log=log)
    else:
        from slurm_elastic.showcase.chaos import run_chaos

        summary = run_chaos(
            args.seed, args.faults, nodes=args.nodes, reduce_dtype=args.reduce_dtype, losses=args.losses, log=log
        )
    print_result(summary, args.json)
    return 0 if summary["ok"] else 1
