"""`slurm-elastic run --local` as a user meets it: a wrong command ends the job within seconds with one
line naming the command, its exit code and its last words; a script that fails after training never
exits 0; SIGTERM ends the run within seconds in any phase, leaving no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import EXAMPLE

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(180)]
HERE = Path(__file__).parent


def run(*command: str, nodes: int = 2, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "slurm_elastic", "run", "--local", "--nodes", str(nodes), "--", *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("slurm-elastic: error:")]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def test_a_missing_script_ends_the_job_with_the_command_its_code_and_its_last_words() -> None:
    done = run(sys.executable, "/nonexistent/train.py")
    assert done.returncode == 1
    line = error_line(done)
    assert "exited with 2" in line and "without joining the job" in line
    assert "No such file or directory" in line and "/nonexistent/train.py" in line


def test_a_typo_in_the_scripts_arguments_fails_the_job_at_its_first_start_on_every_node(corpus: Path) -> None:
    done = run(sys.executable, str(EXAMPLE), "--data", str(corpus), "--stepz", "3")
    assert done.returncode == 1
    line = error_line(done)
    assert "exited with 2 on every node without joining the job" in line, line
    assert "unrecognized arguments: --stepz 3" in line, line
    exits = [x for x in done.stderr.splitlines() if "worker_exited" in x and "job=" in x]
    assert 2 <= len(exits) <= 4, exits  # each node's first start, and at most one restart begun meanwhile


def test_a_script_that_never_uses_the_library_ends_the_job() -> None:
    done = run(sys.executable, "-c", "print('hello')", nodes=1)
    assert done.returncode == 1
    assert "exited with 0" in error_line(done) and "ElasticJob" in error_line(done)


def test_a_script_that_fails_after_training_never_reports_success(corpus: Path) -> None:
    done = run(sys.executable, str(HERE / "train_then_fail.py"), "--data", str(corpus), "--steps", "3")
    assert done.returncode == 1
    line = error_line(done)
    assert "finished training, but then" in line and "local2" in line and "exited with 1" in line
    assert "disk quota exceeded" in done.stderr, "the script's own traceback is shown"


@pytest.mark.parametrize(
    ("phase", "sig"),
    [("rendezvous", signal.SIGTERM), ("training", signal.SIGTERM), ("training", signal.SIGINT)],
)
def test_sigterm_or_ctrl_c_ends_the_run_within_seconds_as_a_stop(corpus: Path, phase: str, sig: int) -> None:
    if phase == "rendezvous":  # workers that take long to start: no one has joined yet
        command = [sys.executable, "-c", "import time; time.sleep(600)"]
    else:
        command = [sys.executable, str(EXAMPLE), "--data", str(corpus), "--steps", "100000"]
    argv = [sys.executable, "-m", "slurm_elastic", "run", "--local", "--nodes", "2", "--", *command]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        time.sleep(12 if phase == "training" else 3)
        assert proc.poll() is None, "still running before the signal"
        proc.send_signal(sig)  # Ctrl-C: the terminal signals the launcher's process group, not the nodes'
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the run did not end within 30 s of the signal:\n{proc.communicate()[1][-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if sig == signal.SIGINT:
        assert proc.returncode == 130, stderr[-2000:]
        assert "stopped by the user (Ctrl-C)" in stderr and "error" not in stderr.splitlines()[-1]
    else:
        assert proc.returncode == 143, stderr[-2000:]
        assert "stopped by SIGTERM" in stderr
    assert "job_cancelled" in stderr and "job_failed" not in stderr and "all members lost" not in stderr
    leftovers = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert leftovers == [], "every process of the run ended with it"
