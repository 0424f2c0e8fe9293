"""`slurm-elastic run`: start a job, locally (`--local`, simulated nodes) or inside a Slurm allocation."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys

from slurm_elastic.commands.common import add_job_flags, command_after_dashes, fail, job_config
from slurm_elastic.launch.local import JobResult, LocalJob
from slurm_elastic.logs import configure_logging
from slurm_elastic.sanitize import printable_lines

CTRL_C = "the user (Ctrl-C)"


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
    job = LocalJob(command, config)

    # Before anything slow (start-up imports torch): a SIGTERM or a Ctrl-C at any moment ends the run. A
    # handler, not KeyboardInterrupt: raised inside a lock's wait, that can leave the lock held for good.
    def stop_by(signum: int, _frame: object) -> None:
        job.cancel(CTRL_C if signum == signal.SIGINT else signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop_by)
    signal.signal(signal.SIGINT, stop_by)
    try:
        job.start()
        result = job.wait(agents_timeout=None)  # the script may still save its model after training
    finally:
        job.stop()
    if result.phase == "cancelled" and result.reason == CTRL_C:
        print(f"slurm-elastic: job {job.job_id} stopped by {CTRL_C}", file=sys.stderr)
        return 130
    return report(job.job_id, result, command)


def report(job_id: str, result: JobResult, command: list[str]) -> int:
    """The exit status of `run --local`, with a one-line error for anything but a clean finish."""
    if result.ok:
        return 0
    if result.phase == "cancelled":
        return fail(f"job {job_id} stopped by {result.reason}", 143)
    if result.phase == "finished":
        failed = list(result.failed_after_training) or [
            f"the agent of {node} exited with {code}" for node, code in result.agent_exit_codes.items() if code
        ]
        return fail(f"job {job_id} finished training, but then: {'; '.join(failed)}", 1)
    if result.failure_traceback:
        sys.stderr.write(printable_lines(result.failure_traceback.rstrip("\n")) + "\n")
    return fail(f"job {job_id} {result.phase}: {result.reason} [command: {shlex.join(command)}]", 1)
