"""The `slurm-elastic` command line."""

from __future__ import annotations

import argparse
import os
import sys

from slurm_elastic import __version__
from slurm_elastic.errors import ConfigError, ElasticError
from slurm_elastic.logs import configure_logging, drop_unwritable_output
from slurm_elastic.sanitize import printable_lines


def build_parser() -> argparse.ArgumentParser:
    from slurm_elastic.commands import bench, chaos, demo, jobs, run, simulate
    from slurm_elastic.data import cli as data_cli
    from slurm_elastic.hooks import cli as hooks_cli

    parser = argparse.ArgumentParser(
        prog="slurm-elastic", description="Checkpointless, elastic PyTorch training on Slurm"
    )
    parser.add_argument("--version", action="version", version=f"slurm-elastic {__version__}")
    sub = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")
    run.add_parser(sub)
    sub.add_parser("agent", help="the per-node agent (started by `run` and by satellite jobs; see --help)")
    data_cli.add_parser(sub)
    demo.add_parser(sub)
    bench.add_parser(sub)
    chaos.add_parser(sub)
    simulate.add_parser(sub)
    jobs.add_parsers(sub)
    hooks_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    finally:
        drop_unwritable_output()


def _main(argv: list[str]) -> int:
    if argv[:1] == ["agent"]:  # its own parser: it takes a command after --, options and all
        from slurm_elastic import agent

        return agent.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    # Quiet by default; `run` reconfigures from the job's settings, the benchmarks print their own lines.
    configure_logging("json" if os.environ.get("SLURM_ELASTIC_LOG_FORMAT") == "json" else "console", "WARNING")
    try:
        code = args.func(args)
    except ConfigError as exc:
        print(f"slurm-elastic: error: {printable_lines(str(exc))}", file=sys.stderr)
        return 2
    except ElasticError as exc:  # may quote a peer's reason or a worker's stderr: shown, never acted on
        print(f"slurm-elastic: error: {printable_lines(str(exc))}", file=sys.stderr)
        return 1
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
