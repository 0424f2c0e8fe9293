"""`slurm-elastic run`: start a job, locally (`--local`, simulated nodes) or inside a Slurm allocation."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from slurm_elastic.commands.common import add_job_flags, command_after_dashes, fail, job_config
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.logs import configure_logging


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run a training command elastically", description=__doc__)
    p.add_argument("--local", action="store_true", help="simulate the nodes as local processes")
    add_job_flags(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- followed by the training command")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    command = command_after_dashes(args.command)
    if not command:
        return fail("no training command: put it after --, e.g. `-- python train.py`")
    if not args.local:
        from slurm_elastic.launch.slurm import run_in_allocation

        return run_in_allocation(args, command)
    config = job_config(args, os.environ)
    configure_logging(config.log_format, config.log_level)
    job = LocalJob(command, config).start()
    stop = lambda *_: job.stop()  # noqa: E731 - a signal handler
    signal.signal(signal.SIGTERM, stop)
    try:
        result = job.wait()
    except KeyboardInterrupt:
        job.stop()
        return 130
    finally:
        job.stop()
    if result.ok:
        return 0
    if result.failure_traceback:
        sys.stderr.write(result.failure_traceback)
    return fail(f"job {job.job_id} {result.phase}: {result.reason}", 1)
