"""The launcher's end inside an allocation: the agents' srun has the drain grace to end by itself while an agent
is still connected (or nobody can tell), and is ended at once when none is: then all it waits for is Slurm's
bookkeeping of a node a shrink took away. `srun` is a real process; the coordinator is the real one."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from slurm_elastic.config import JobConfig
from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.launch.slurm import SlurmLaunch
from slurm_elastic.testing.fakeslurm import FakeSlurm
from slurm_elastic.wire.channel import new_secret

pytestmark = pytest.mark.timeout(120)
GRACE_S = 90.0


def _launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, srun: list[str]) -> SlurmLaunch:
    monkeypatch.setenv("SLURM_ELASTIC_HOME", str(tmp_path / "home"))
    slurm = FakeSlurm("n[1-2]")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/sh\n")
    job = slurm.submit(script, args=["--nodes=2"])
    slurm.start_pending()
    launch = SlurmLaunch(JobConfig(drain_grace_s=GRACE_S), ["train"], slurm, job)
    launch.srun = subprocess.Popen(srun)
    return launch


def _coordinator() -> CoordinatorThread:
    return CoordinatorThread(CoordinatorConfig(job_id="1", secret=new_secret(), expected_workers=2)).start()


def test_with_no_agent_connected_the_srun_left_waiting_is_ended_long_before_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = _launch(tmp_path, monkeypatch, ["sleep", "600"])
    launch.coordinator = _coordinator()
    started = time.monotonic()
    launch.finish("finished")
    assert launch.srun is not None and launch.srun.returncode == -signal.SIGTERM
    assert time.monotonic() - started < GRACE_S / 3


def test_where_nobody_can_tell_srun_takes_its_time_to_end_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = _launch(tmp_path, monkeypatch, ["sleep", "1.5"])  # agents still ending their workers
    launch.finish("failed")
    assert launch.srun is not None and launch.srun.returncode == 0


def test_a_coordinator_that_is_gone_cannot_tell_and_the_end_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = _launch(tmp_path, monkeypatch, ["sleep", "1.5"])
    launch.coordinator = _coordinator()
    launch.coordinator.stop()  # its loop is closed: asking it raises
    launch.finish("failed")
    assert launch.srun is not None and launch.srun.returncode == 0


@pytest.mark.parametrize(
    ("state", "base_state", "flags", "ending"),
    [
        ("RUNNING", "RUNNING", set(), False),  # the time-limit warning, a drain of every node: come back
        ("COMPLETING", None, {"COMPLETING"}, True),  # scancel as Slurm 22.05's text shows it
        ("COMPLETING", None, set(), True),
        ("CANCELLED", "CANCELLED", {"COMPLETING"}, True),  # scancel as JSON shows it (24.11)
        ("PREEMPTED", "PREEMPTED", {"COMPLETING"}, True),  # a preemption that cancels
        ("TIMEOUT", "TIMEOUT", set(), True),
        ("REQUEUED", "PENDING", {"REQUEUED"}, False),  # Slurm requeued it already: another requeue is refused
    ],
)
def test_a_job_slurm_is_already_ending_is_not_requeued(
    state: str, base_state: str | None, flags: set[str], ending: bool
) -> None:
    from slurm_elastic.launch.slurm import slurm_is_ending
    from slurm_elastic.slurm import JobInfo

    info = JobInfo("7", state=state, base_state=base_state, flags=frozenset(flags))
    assert slurm_is_ending(info) is ending
