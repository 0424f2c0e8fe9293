"""`python -m slurm_elastic.testing.devcluster {up,down,status,env}`: the local Slurm test cluster."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from slurm_elastic.errors import ElasticError
from slurm_elastic.testing.devcluster.cluster import LocalCluster

EXIT_DOWN = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m slurm_elastic.testing.devcluster", description=__doc__)
    parser.add_argument("--dir", type=Path, default=None, help="state directory (default: <repo>/.cluster)")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the cluster (idempotent); installs packages as root if needed")
    up.add_argument(
        "--hooks",
        type=Path,
        default=None,
        metavar="DIR",
        help="configure the admin hooks found in DIR (prolog, epilog, healthcheck, prolog_slurmctld, epilog_slurmctld)",
    )
    sub.add_parser("down", help="stop every process of the cluster (idempotent)")
    sub.add_parser("status", help=f"print sinfo and squeue; exit 0 when up, {EXIT_DOWN} when down")
    sub.add_parser("env", help="print `export SLURM_CONF=...` for a shell to eval")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cluster = LocalCluster(args.dir)
    try:
        if args.command == "up":
            started = cluster.up(hooks_dir=args.hooks)
            print(
                f"local Slurm cluster {'started' if started else 'already up'}: "
                f"export SLURM_CONF={shlex.quote(str(cluster.slurm_conf_path))}"
            )
        elif args.command == "down":
            cluster.down()
            print("local Slurm cluster stopped")
        elif args.command == "status":
            print(cluster.status())
            return 0 if cluster.is_up() else EXIT_DOWN
        else:
            print(f"export SLURM_CONF={shlex.quote(str(cluster.slurm_conf_path))}")
    except ElasticError as exc:
        print(f"devcluster {args.command}: error: {exc}", file=sys.stderr)
        detail = getattr(exc, "detail", "")
        if detail:
            print("\n".join(f"  | {line}" for line in str(detail).splitlines()), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"devcluster {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
