"""`slurm-elastic bench`: measurements that compare slurm-elastic with the usual practice, in one run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slurm_elastic.commands.common import fail, print_result


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", help="benchmarks (mttr, overhead, coordinator, rendezvous, notify)", description=__doc__
    )
    which = p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    mttr = which.add_parser("mttr", help="recovery time after a node's SIGKILL: elastic vs checkpoint-restart")
    mttr.add_argument("--json", action="store_true", help="print one JSON object")
    mttr.add_argument("--nodes", type=int, default=4)
    mttr.add_argument("--kills", type=int, default=5)
    mttr.add_argument("--mode", choices=("ddp", "fsdp"), default="ddp", help="the workload: replicas or FSDP2 shards")
    mttr.add_argument("--slurm", action="store_true", help="on the local Slurm cluster (job requeue as the baseline)")
    mttr.set_defaults(func=run_mttr)
    overhead = which.add_parser(
        "overhead", help="seconds per step and peak memory: ElasticJob (float32, float64) vs plain torch DDP"
    )
    overhead.add_argument("--json", action="store_true", help="print one JSON object")
    overhead.add_argument("--repeats", type=int, default=2, help="runs of each mode per size (median)")
    overhead.add_argument("--sizes", default="small,medium,large", help="model sizes to run (small,medium,large)")
    overhead.add_argument(
        "--mode",
        choices=("all", "ddp", "fsdp"),
        default="all",
        help="what to compare: replicas against DDP, FSDP2 shards against plain FSDP2, or both",
    )
    overhead.set_defaults(func=run_overhead)
    rendezvous = which.add_parser(
        "rendezvous", help="store operations and time to form a generation's group, against world size"
    )
    rendezvous.add_argument("--json", action="store_true", help="print one JSON object")
    rendezvous.add_argument("--nccl-worlds", default="1024,4096,16384", help="simulated NCCL worlds to run")
    rendezvous.add_argument("--gloo-worlds", default="32,64,128", help="simulated gloo worlds to run (N^2 ops)")
    rendezvous.add_argument("--processes", type=int, default=4, help="processes that play the simulated ranks")
    rendezvous.add_argument("--rounds", type=int, default=3, help="generations formed per world (median)")
    rendezvous.set_defaults(func=run_rendezvous)
    coordinator = which.add_parser(
        "coordinator", help="the coordinator under thousands of simulated nodes: detection, formation, CPU, memory"
    )
    coordinator.add_argument("--json", action="store_true", help="print one JSON object")
    coordinator.add_argument("--agents", type=int, default=256, help="simulated nodes (1 to 4096)")
    coordinator.add_argument("--workers", type=int, default=1, help="workers per node (1 to 8)")
    coordinator.add_argument("--processes", type=int, default=4, help="processes that play the simulated nodes")
    coordinator.add_argument("--kills", type=int, default=10, help="nodes whose connections close, one at a time")
    coordinator.add_argument("--silences", type=int, default=5, help="nodes that fall silent, 1 s apart")
    coordinator.add_argument("--drains", type=int, default=3)
    coordinator.add_argument("--joins", type=int, default=3)
    coordinator.add_argument("--steady-s", type=float, default=10.0, help="seconds of steady state measured")
    coordinator.set_defaults(func=run_coordinator)
    report = which.add_parser("report", help="docs/benchmarks.md and its plots, from the benchmarks' JSON files")
    report.add_argument("--dir", type=Path, default=Path("docs/bench"), help="the benchmarks' JSON files")
    report.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    report.set_defaults(func=run_report)
    from slurm_elastic.hooks import bench as notify

    notify.add_parser(which)


def run_mttr(args: argparse.Namespace) -> int:
    if args.nodes < 2 or args.kills < 1:
        return fail(f"--nodes {args.nodes} --kills {args.kills}: need at least 2 nodes and 1 kill")
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.slurm and args.mode != "ddp":
        return fail("--slurm --mode fsdp: the Slurm MTTR benchmark runs the replica workload only")
    if args.slurm:
        from slurm_elastic.showcase.bench import slurm_mttr

        result = slurm_mttr.run(nodes=args.nodes, kills=args.kills, log=log)
    else:
        from slurm_elastic.showcase.bench.mttr import MttrPlan, run

        result = run(MttrPlan(nodes=args.nodes, kills=args.kills, workload=args.mode), log)
    print_result(result, args.json)
    return 0


def run_overhead(args: argparse.Namespace) -> int:
    from slurm_elastic.showcase.bench.overhead import SIZES, WORKLOADS, OverheadPlan, run

    known = {s.name: s for s in SIZES}
    names = [n.strip() for n in args.sizes.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        return fail(f"--sizes {args.sizes!r}: expected a comma-separated list of {', '.join(known)}")
    if args.repeats < 1:
        return fail(f"--repeats {args.repeats}: expected an integer >= 1")
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    plan = OverheadPlan(sizes=tuple(known[n] for n in names), repeats=args.repeats, modes=WORKLOADS[args.mode])
    result = run(plan, log)
    print_result(result, args.json)
    return 0


def run_rendezvous(args: argparse.Namespace) -> int:
    from slurm_elastic.showcase.bench.rendezvous import RendezvousPlan, run

    worlds: dict[str, tuple[int, ...]] = {}
    for flag in ("nccl_worlds", "gloo_worlds"):
        text = getattr(args, flag)
        try:
            worlds[flag] = tuple(int(w) for w in text.split(","))
        except ValueError:
            worlds[flag] = ()
        if not worlds[flag] or min(worlds[flag]) < 2 or max(worlds[flag]) > 16384:
            return fail(f"--{flag.replace('_', '-')} {text}: give comma-separated world sizes from 2 to 16384")
    if args.processes < 1 or args.rounds < 1:
        return fail(f"--processes {args.processes} --rounds {args.rounds}: need at least 1 of each")
    plan = RendezvousPlan(worlds["nccl_worlds"], worlds["gloo_worlds"], processes=args.processes, rounds=args.rounds)
    result = run(plan, lambda line: print(line, file=sys.stderr, flush=True))
    print_result(result, args.json)
    return 0


def run_coordinator(args: argparse.Namespace) -> int:
    from slurm_elastic.showcase.bench.coordinator import CoordinatorPlan, run

    if not 1 <= args.agents <= 4096 or not 1 <= args.workers <= 8:
        return fail(f"--agents {args.agents} --workers {args.workers}: expected 1 to 4096 agents of 1 to 8 workers")
    faults = (args.kills, args.silences, args.drains, args.joins)
    if min(faults) < 0 or args.processes < 1 or args.steady_s <= 0:
        return fail("--kills, --silences, --drains, --joins: expected counts >= 0; --processes >= 1; --steady-s > 0")
    if args.kills + args.silences + args.drains >= args.agents:
        return fail(f"--agents {args.agents}: fewer than the {sum(faults[:3])} nodes the faults take away, plus one")
    plan = CoordinatorPlan(args.agents, args.workers, args.processes, *faults, steady_s=args.steady_s)
    result = run(plan, lambda line: print(line, file=sys.stderr, flush=True))
    print_result(result, args.json)
    return 0


def run_report(args: argparse.Namespace) -> int:
    from slurm_elastic.showcase.bench.report import write_report

    if not args.dir.is_dir():
        return fail(f"--dir {args.dir}: not a directory (the benchmarks' JSON files; `make bench` writes them)")
    print(write_report(args.dir, args.out))
    return 0
