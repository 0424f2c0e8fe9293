"""The program the local cluster gives slurmstepd for an unkillable step records what was left, zombies and
processes in uninterruptible sleep with their kernel stacks, where the suite reports it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_elastic.testing.devcluster.layout import Layout
from slurm_elastic.testing.devcluster.unkillable import UNKILLABLE_STEP_PROGRAM, report_step, step_log, summarize

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(sys.platform != "linux", reason="needs /proc")]


def test_the_unkillable_step_program_records_every_process_and_the_zombies(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "state dir")  # a space: the log dir is quoted in the program
    layout.log_dir.mkdir(parents=True)
    layout.unkillable_program.write_text(UNKILLABLE_STEP_PROGRAM.replace("@LOG_DIR@", f"'{layout.log_dir}'"))
    layout.unkillable_program.chmod(0o755)
    # A parent that never reaps its child: the child stays a zombie, as a process a step could not end.
    # It also holds the write end of a pipe whose read end this test (the "slurmstepd") has, as an orphan
    # that kept a task's output open would.
    read_end, write_end = os.pipe()
    parent = subprocess.Popen(
        [sys.executable, "-c", "import os, sys, time; pid = os.fork()\nif pid == 0: os._exit(0)\n"
         "print(pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, pass_fds=(write_end,),
    )  # fmt: skip
    os.close(write_end)
    try:
        assert parent.stdout is not None
        zombie = int(parent.stdout.readline())
        while Path(f"/proc/{zombie}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.01)
        env = {"SLURM_JOB_ID": "26", "SLURM_STEP_ID": "0"}  # all slurmstepd gives it: no PATH
        subprocess.run([str(layout.unkillable_program)], env=env, check=True, timeout=30)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()  # type: ignore[union-attr]
        pipe = os.readlink(f"/proc/self/fd/{read_end}")
        os.close(read_end)
    (report,) = layout.unkillable_reports()
    assert report.name.startswith("unkillable-26.0.")
    text = report.read_text()
    assert text.startswith(f"job 26 step 0, slurmstepd {os.getpid()}, ")
    assert f"== {zombie} thread {zombie} Z:" in text
    assert any(line.split()[:2] == [str(parent.pid), str(os.getpid())] for line in text.splitlines()[2:])
    # The summary keeps the subtree of the "slurmstepd": here this test's process, which ran the program.
    summary = summarize(text)
    assert summary[0].startswith("job 26 step 0")
    pids = [line.split()[0] for line in summary[1:] if not line.startswith("== ")]
    assert pids[0] == str(os.getpid()) and str(parent.pid) in pids and str(zombie) in pids
    assert any(line.startswith(f"== {zombie} thread {zombie} Z:") for line in summary)
    assert any(line.startswith(f"== slurmstepd {os.getpid()} thread {os.getpid()} ") for line in summary)
    held = f"== {pipe} of slurmstepd also held by {parent.pid}: {sys.executable} -c import os"
    assert any(line.startswith(held) for line in summary)
    assert len(summary) < len(text.splitlines()) / 2  # not the whole machine


def test_a_report_names_its_step_and_the_step_log_says_how_far_the_teardown_got() -> None:
    assert report_step("unkillable-26.0.4711.txt") == ("26", "0")
    log = "\n".join([
        "[2026-12-01T00:15:24.729] launch task StepId=26.0 request from UID:0",
        "[2026-12-01T00:15:33.700] [26.0] debug:  Waiting for IO",
        "[2026-12-01T00:15:33.700] [26.1] debug:  Waiting for IO",
        "[2026-12-01T00:15:33.700] [126.0] debug:  Waiting for IO",
        "[2026-12-01T00:16:34.000] [26.0] error: *** STEP 26.0 STEPD TERMINATED ON n4 AT 2026-12-01T00:16:33 ***",
    ])  # fmt: skip
    assert [line[-16:] for line in step_log(log, "26", "0")] == ["  Waiting for IO", log[-16:]]
    assert step_log(log, "26", "0", last=1) == [log.splitlines()[-1]]
    assert step_log(log, "26", "1") == []  # slurmstepd did not give up on 26.1 on this node
