"""`slurm-elastic hooks install|check`: the admin's two commands (also `python -m slurm_elastic.hooks.cli`).

Wire into the main command line with `hooks.cli.add_parser(sub)`; the handlers are `run_install` and
`run_check` (each takes the parsed arguments and returns the exit code).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from slurm_elastic.errors import ConfigError
from slurm_elastic.hooks.check import check_installation
from slurm_elastic.hooks.install import DEFAULT_TIMEOUT_S, MIN_INTERVAL_S, InstallOptions, install, slurm_conf_lines

__all__ = ["add_parser", "main", "run_check", "run_install"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("hooks", help="install and check the admin hooks (prolog, epilog, health check)")
    which = p.add_subparsers(dest="hooks_command", required=True, metavar="ACTION")
    inst = which.add_parser("install", help="copy the hooks to DIR and print the slurm.conf lines to add")
    inst.add_argument("--prefix", type=Path, required=True, metavar="DIR", help="where Slurm will run them from")
    inst.add_argument("--python", type=Path, default=Path(sys.executable), help="interpreter with slurm-elastic")
    inst.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help="hard bound of each run, seconds")
    inst.add_argument(
        "--healthcheck-interval", type=int, default=MIN_INTERVAL_S, help="HealthCheckInterval to print, seconds"
    )
    inst.add_argument("--watch", type=float, default=None, help="watch_s (default: the interval less 0.75 s)")
    inst.add_argument("--slurm-conf", type=Path, default=None, help="SLURM_CONF for the health check, if not default")
    inst.add_argument("--log-dir", type=Path, default=None, help="hooks.log directory (default: DIR/log)")
    inst.add_argument("--state-dir", type=Path, default=None, help="health check state (default: /run/slurm-elastic)")
    inst.add_argument("--cache-dir", default=None, help="node-local data cache, %%n = node name")
    inst.add_argument("--source", type=Path, default=None, help="the hook scripts to copy (default: repo hooks/)")
    inst.add_argument("--force-config", action="store_true", help="replace an existing hooks.toml")
    inst.set_defaults(func=run_install)
    chk = which.add_parser("check", help="validate an installation; exit 1 on any problem")
    chk.add_argument("--prefix", type=Path, required=True, metavar="DIR")
    chk.add_argument("--slurm-conf", type=Path, default=None, help="also check that slurm.conf enables the hooks")
    chk.set_defaults(func=run_check)


def run_install(args: argparse.Namespace) -> int:
    prefix = args.prefix.absolute()
    opts = InstallOptions(
        prefix=prefix,
        python=args.python.absolute(),
        timeout_s=args.timeout,
        healthcheck_interval_s=args.healthcheck_interval,
        watch_s=args.watch,
        slurm_conf=args.slurm_conf.absolute() if args.slurm_conf else None,
        log_dir=args.log_dir.absolute() if args.log_dir else None,
        state_dir=args.state_dir.absolute() if args.state_dir else None,
        cache_dir=args.cache_dir,
        source=args.source,
        force_config=args.force_config,
    )
    for line in install(opts):
        print(line)
    print("\nAdd to slurm.conf (on every node and the controller), then `scontrol reconfigure`:\n")
    for line in slurm_conf_lines(prefix, interval_s=opts.healthcheck_interval_s, timeout_s=opts.timeout_s):
        print(f"    {line}")
    check = f"slurm-elastic hooks check --prefix {shlex.quote(str(prefix))}"
    print(f"\nThen: {check} --slurm-conf /etc/slurm/slurm.conf")
    return 0


def run_check(args: argparse.Namespace) -> int:
    findings = check_installation(args.prefix.absolute(), args.slurm_conf)
    for finding in findings:
        print(finding)
    failed = sum(f.level == "FAIL" for f in findings)
    print(f"\n{'ok' if not failed else f'{failed} problem(s)'}: {args.prefix}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slurm-elastic")
    add_parser(parser.add_subparsers(dest="command_name", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"slurm-elastic: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
