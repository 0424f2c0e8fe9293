"""The agent's command line: one type writes it (every launcher) and reads it (the agent), round trip
exact, defaults in one place, and a bad value refused in one line naming it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.agentspec import LEASE_TIMEOUT_S, AgentLaunch, agent_launch
from slurm_elastic.config import JobConfig
from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.jobdir import LaunchInfo
from slurm_elastic.wire.messages import WorkerSettings

REPO = Path(__file__).resolve().parents[2]
words = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    command=st.lists(words, min_size=1, max_size=4),
    node=st.none() | words.filter(lambda w: not w.startswith("-")),
    nproc=st.integers(1, 64),
    max_restarts=st.integers(0, 9),
    drain=st.floats(0.01, 1e4),
    heartbeat=st.floats(0.01, 100),
    lease=st.floats(0.01, 1e3),
    requeue=st.booleans(),
)
def test_what_a_launcher_writes_the_agent_reads_back_exactly(
    command: list[str], node: str | None, nproc: int, max_restarts: int, drain: float, heartbeat: float,
    lease: float, requeue: bool,
) -> None:  # fmt: skip
    launch = AgentLaunch(
        command=tuple(command), coordinator="10.0.0.1:4242", job_id="j-1", node=node, nproc=nproc,
        max_restarts=max_restarts, drain_grace_s=drain, heartbeat_interval_s=heartbeat, lease_timeout_s=lease,
        requeue_on_coordinator_loss=requeue,
    )  # fmt: skip
    argv = launch.to_argv()
    assert argv[1:3] == ["-m", "slurm_elastic.agent"]
    assert AgentLaunch.from_argv(argv[3:]) == launch


def test_a_satellites_join_form_round_trips_and_takes_its_command_from_the_core_job() -> None:
    launch = AgentLaunch(join="1234", node="n7")
    assert launch.to_argv()[3:] == ["--join", "1234", "--node", "n7"]
    assert AgentLaunch.from_argv(launch.to_argv()[3:]) == launch


def test_the_satellite_templates_agent_line_parses() -> None:
    template = (REPO / "sbatch_templates" / "elastic_satellite.sbatch").read_text()
    line = re.search(r"-m slurm_elastic agent (.*)", template)
    assert line is not None
    args = [a.strip('"') for a in line.group(1).split()]
    launch = AgentLaunch.from_argv([a.replace("$SLURM_ELASTIC_CORE_JOB", "77") for a in args])
    assert launch.join == "77"


def test_defaults_are_left_off_the_command_line_and_agree_with_the_job_and_coordinator() -> None:
    job = JobConfig()
    launch = agent_launch(job, ["python", "train.py"], coordinator="h:1", job_id="j")
    assert launch.to_argv()[3:] == ["--coordinator", "h:1", "--job-id", "j", "--", "python", "train.py"]
    lease = {
        "AgentLaunch": AgentLaunch().lease_timeout_s,
        "JobConfig": job.lease_timeout_s,
        "CoordinatorConfig": CoordinatorConfig.__dataclass_fields__["lease_timeout_s"].default,
        "LaunchInfo": LaunchInfo.__dataclass_fields__["lease_timeout_s"].default,
        "WorkerSettings": WorkerSettings.model_fields["lease_timeout_s"].default,
    }
    assert set(lease.values()) == {LEASE_TIMEOUT_S}, lease


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--coordinator", "h:1", "--job-id", "j", "--nproc", "0", "--", "x"], "--nproc 0"),
        (["--coordinator", "h:1", "--job-id", "j", "--lease-timeout-s", "-1", "--", "x"], "--lease-timeout-s -1.0"),
        (["--coordinator", "h:1", "--job-id", "j", "--max-restarts", "-2", "--", "x"], "--max-restarts -2"),
        (["--coordinator", "h:1", "--", "x"], "--job-id"),
        (["--join", "5", "--job-id", "j"], "--join"),
        (["--coordinator", "h:1", "--job-id", "j", "--nproc", "two", "--", "x"], "--nproc"),
    ],
)
def test_a_bad_command_line_is_one_line_naming_the_value_and_exit_2(argv: list[str], named: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "slurm_elastic.agent", *argv], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "SLURM_ELASTIC_SECRET": "s" * 32},
    )  # fmt: skip
    assert out.returncode == 2
    error = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and named in error[0], out.stderr


def test_an_invalid_launch_is_not_written() -> None:
    with pytest.raises(ValueError, match="--nproc 0 is invalid"):
        AgentLaunch(command=("x",), coordinator="h:1", job_id="j", nproc=0).to_argv()
