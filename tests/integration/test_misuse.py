"""A script that misuses the training loop gets the documented error where the misuse happens, and
`slurm-elastic run` does not report success (tests/integration/misuse_script.py)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_elastic.worker.checkpoints.checkpoint import read_checkpoint

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).with_name("misuse_script.py")


def run(tmp: Path, mode: str) -> tuple[int, str]:
    env = {**os.environ, "SLURM_ELASTIC_HOME": str(tmp / "home")}
    argv = [
        sys.executable, "-m", "slurm_elastic", "run", "--local", "--nodes", "2", "--heartbeat-interval-s", "0.2",
        "--lease-timeout-s", "3", "--", sys.executable, str(SCRIPT), "--mode", mode,
        "--save-to", str(tmp / "saved.pt"),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("break", "the training loop job.micro_batches() was left during step 4 (an exception out of the loop body"),
        (
            "disagree",
            "the loop of local1:0:0 at step 3 (job.micro_batches() left at step 3) ended, but local2:0:0 went on",
        ),
        ("lengths", "the workers' training loops differ: total_steps "),
        ("save_mid", "UsageError: job.save() called during step 3, after its first job.backward(): save between"),
        ("outside", "UsageError: job.backward() called outside a micro-batch"),
    ],
)
def test_a_misused_loop_fails_the_job_with_the_documented_error(tmp_path: Path, mode: str, error: str) -> None:
    code, out = run(tmp_path, mode)
    assert code != 0, out[-3000:]
    assert error in out, out[-3000:]
    assert "job_finished" not in out
    if mode in ("break", "save_mid", "outside"):
        assert "user_failure" in out and "all members lost" not in out


@pytest.mark.parametrize(("mode", "step"), [("leave", 3), ("stop", None)])
def test_a_loop_every_rank_leaves_at_one_boundary_ends_the_job_there(tmp_path: Path, mode: str, step: int) -> None:
    code, out = run(tmp_path, mode)
    assert code == 0, out[-3000:]
    ends = re.findall(r"after the loop at step (\d+), rank (\d) of 2", out)  # two processes' lines may interleave
    assert sorted(rank for _, rank in ends) == ["0", "1"] and len({s for s, _ in ends}) == 1, ends  # one step on both
    if step is not None:
        assert ends[0][0] == str(step)
    else:
        assert "enough for this test" in out
    assert "job_finished" in out and "user_failure" not in out


def test_a_save_before_a_steps_first_backward_is_between_steps_and_resumes_there(tmp_path: Path) -> None:
    code, out = run(tmp_path, "save_top")
    assert code == 0 and "after the loop at step 6" in out, out[-3000:]
    step, _ = read_checkpoint(tmp_path / "saved.pt")
    assert step == 3


def test_calling_the_loop_again_after_it_finished_is_an_error_and_the_worker_exits_1(tmp_path: Path) -> None:
    code, out = run(tmp_path, "twice")
    assert "job.micro_batches() called after job.micro_batches() finished the job at step 5" in out, out[-3000:]
    exits = [line for line in out.splitlines() if "worker_exited" in line and "will_restart" in line]
    assert exits and all("returncode=1" in line for line in exits), exits
    assert code == 1, "the job had finished training, but its workers failed after it: never a success"
    assert "finished training, but then" in out
