"""The program the local cluster gives slurmstepd for an unkillable step records what was left, zombies and
processes in uninterruptible sleep with their kernel stacks, where the suite reports it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_elastic.devcluster.layout import Layout
from slurm_elastic.devcluster.unkillable import UNKILLABLE_STEP_PROGRAM, summarize

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(sys.platform != "linux", reason="needs /proc")]


def test_the_unkillable_step_program_records_every_process_and_the_zombies(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "state dir")  # a space: the log dir is quoted in the program
    layout.log_dir.mkdir(parents=True)
    layout.unkillable_program.write_text(UNKILLABLE_STEP_PROGRAM.replace("@LOG_DIR@", f"'{layout.log_dir}'"))
    layout.unkillable_program.chmod(0o755)
    # A parent that never reaps its child: the child stays a zombie, as a process a step could not end.
    parent = subprocess.Popen(
        [sys.executable, "-c", "import os, sys, time; pid = os.fork()\nif pid == 0: os._exit(0)\n"
         "print(pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert parent.stdout is not None
        zombie = int(parent.stdout.readline())
        while Path(f"/proc/{zombie}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.01)
        env = {**os.environ, "SLURM_JOB_ID": "26", "SLURM_STEP_ID": "0"}
        subprocess.run([str(layout.unkillable_program)], env=env, check=True, timeout=30)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()  # type: ignore[union-attr]
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
    assert len(summary) < len(text.splitlines()) / 2  # not the whole machine
