"""`slurm-elastic bench`: measurements that compare slurm-elastic with the usual practice, in one run."""

from __future__ import annotations

import argparse
import sys

from slurm_elastic.commands.common import fail, print_result


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="benchmarks (mttr, notify)", description=__doc__)
    which = p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    mttr = which.add_parser("mttr", help="recovery time after a node's SIGKILL: elastic vs checkpoint-restart")
    mttr.add_argument("--json", action="store_true", help="print one JSON object")
    mttr.add_argument("--nodes", type=int, default=4)
    mttr.add_argument("--kills", type=int, default=5)
    mttr.add_argument("--slurm", action="store_true", help="on the local Slurm cluster (job requeue as the baseline)")
    mttr.set_defaults(func=run_mttr)
    from slurm_elastic.hooks import bench as notify

    notify.add_parser(which)


def run_mttr(args: argparse.Namespace) -> int:
    if args.nodes < 2 or args.kills < 1:
        return fail(f"--nodes {args.nodes} --kills {args.kills}: need at least 2 nodes and 1 kill")
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.slurm:
        from slurm_elastic.bench import slurm_mttr

        result = slurm_mttr.run(nodes=args.nodes, kills=args.kills, log=log)
    else:
        from slurm_elastic.bench.mttr import MttrPlan, run

        result = run(MttrPlan(nodes=args.nodes, kills=args.kills), log)
    print_result(result, args.json)
    return 0
