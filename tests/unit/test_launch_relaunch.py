"""The launcher inside an allocation gives a node that came back a new agent, a bounded number of times in a
row, and then gives it up with one event. Slurm is the in-memory FakeSlurm and `srun` a script that records
its arguments and fails, as an agent that cannot start on its node would; the launcher and its coordinator
are the real ones."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from slurm_elastic.config import JobConfig
from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.launch.slurm import SlurmLaunch
from slurm_elastic.testing.fakeslurm import FakeSlurm
from slurm_elastic.wire.channel import new_secret

pytestmark = pytest.mark.timeout(60)


def test_a_node_whose_new_agents_never_register_is_given_up_after_max_relaunches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = tmp_path / "srun-calls"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\nexit 1\n')
    (tmp_path / "bin" / "srun").chmod(0o755)
    monkeypatch.setenv("SLURM_ELASTIC_HOME", str(tmp_path / "home"))
    slurm = FakeSlurm("n[1-3]")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/sh\n")
    job = slurm.submit(script, args=["--nodes=3"])
    slurm.start_pending()
    launch = SlurmLaunch(JobConfig(max_relaunches=2), ["train"], slurm, job)
    launch.relaunch_retry_s = 0.0
    launch._agent_argv = ["agent"]
    launch._agent_env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    launch._had_agent = {"n1", "n2", "n3"}  # every node had an agent; none is registered now
    coordinator = CoordinatorThread(CoordinatorConfig(job_id=job, secret=new_secret(), expected_workers=3)).start()
    launch.coordinator = coordinator
    slurm.fail_node("n3")  # still down: no agent is started there
    try:
        for _ in range(6):
            launch._watch_nodes()
            for step, _ in launch._steps.values():
                step.wait(10)  # the agent "ran" and failed before the next watch
            time.sleep(0.01)
        events = coordinator.coordinator.events.all()
    finally:
        launch.finish("finished")
    started = [e["node"] for e in events if e["event"] == "agent_relaunched"]
    given_up = [e for e in events if e["event"] == "agent_relaunch_given_up"]
    assert sorted(started) == ["n1", "n1", "n2", "n2"]
    assert sorted(e["node"] for e in given_up) == ["n1", "n2"]
    assert "2 new agents in a row did not register" in given_up[0]["reason"]
    lines = calls.read_text().splitlines()
    assert len(lines) == 4 and all("--overlap" in line and line.endswith("agent") for line in lines)
