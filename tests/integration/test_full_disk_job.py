"""A job whose output file and job directory fill up while it trains (a Slurm job's `.out` and
SLURM_ELASTIC_HOME on one full file system) finishes, exit 0, with the uninterrupted run's model.

Seen before: stderr failing with ENOSPC raised out of the coordinator's ticker, the ticker died silently,
no pulse went out again, and every agent declared the coordinator lost one lease later. Here the disks fill
after the first commits, the coordinator is stopped for a moment (its ticker then has something to log),
and the job is held past a lease, all while every log line and every event append fails; `status` still
shows the job's events (the failures once each)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from slurm_elastic import jobdir
from slurm_elastic.commands.jobs import status_of
from slurm_elastic.errors import ElasticError
from slurm_elastic.events import read_events
from slurm_elastic.jobdir import JobHandle
from slurm_elastic.showcase.metrics import max_param_rel_diff
from slurm_elastic.wire import messages as msg

from .conftest import BUCKET_MB, SLOW, STEPS, TOLERANCE

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(240)]
JOB = "full-disk"
LEASE_S = 3.0


def wait_status(handle: Callable[[], JobHandle], check: Callable[[msg.StatusReply], bool], what: str) -> Any:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            status = status_of(handle())
        except ElasticError:  # not started yet
            status = None
        if status is not None and check(status):
            return status
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_job_whose_output_and_job_directory_fill_up_trains_to_the_reference_model(
    corpus: Path, reference: dict[str, torch.Tensor], tmpfs: Any, tmp_path: Path
) -> None:
    logs, home = tmpfs.mount("logs", "1m"), tmpfs.mount("home", "16m")
    until, model = tmp_path / "until", tmp_path / "model.pt"
    until.write_text("3")  # steps above this number wait (train_slow.py's --until-file)
    argv = [
        sys.executable, "-m", "slurm_elastic", "run", "--local", "--nodes", "2", "--job-id", JOB,
        "--heartbeat-interval-s", "0.2", "--lease-timeout-s", str(LEASE_S), "--max-restarts", "0",
        "--reduce-dtype", "float64", "--bucket-mb", str(BUCKET_MB), "--log-level", "INFO",
        "--progress-interval-s", "1000", "--checkpoint-dir", str(home / "checkpoints"), "--checkpoint-every", "2",
        "--", sys.executable, str(SLOW), "--data", str(corpus), "--steps", str(STEPS), "--save", str(model),
        "--until-file", str(until),
    ]  # fmt: skip
    # Buffered output, as under sbatch (PYTHONUNBUFFERED would hide a flush at exit that fails).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"SLURM_ELASTIC_HOME": str(home)}
    job_dir = jobdir.job_dir(JOB, root=home)
    out_path = logs / "job.out"
    with open(out_path, "ab") as out:  # appended to by every process of the job, as sbatch's --output is
        proc = subprocess.Popen(argv, stdout=out, stderr=out, env=env, start_new_session=True)
    try:
        wait_status(lambda: JobHandle.read(job_dir), lambda s: s.step == 3, "the first commits")
        handle = JobHandle.read(job_dir)
        tmpfs.fill(logs, pad=(out_path,))
        tmpfs.fill(home, pad=(job_dir / "events.jsonl",))
        until.write_text("8")
        wait_status(lambda: handle, lambda s: s.step == 8, "step 8 on full disks")
        proc.send_signal(signal.SIGSTOP)  # the launcher (its coordinator) stops: the ticker reports the pause
        time.sleep(1.5)
        proc.send_signal(signal.SIGCONT)
        time.sleep(LEASE_S + 1)  # before: the ticker had died here, and every agent gave up a lease later
        held = status_of(handle)
        until.write_text(str(STEPS))
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert held.state == "running" and held.step == 8 and held.world_size == 2
    kinds = [e["event"] for e in held.events]
    assert "coordinator_paused" in kinds and "checkpoint_failed" in kinds
    assert kinds.count("log_write_failed") == 1 and kinds.count("events_write_failed") == 1, kinds
    assert rc == 0
    assert max_param_rel_diff(torch.load(model), reference) <= TOLERANCE
    assert read_events(job_dir / "events.jsonl"), "the events written before the disk filled, no torn line"
