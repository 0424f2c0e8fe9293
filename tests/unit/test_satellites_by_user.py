"""A core job finds its satellites by their name AND its own user: anyone can name a job `se-sat-<core id>`.
Another user's pending job of that name must neither stand in for a satellite of the pool that
`grow --keep-pending` keeps, nor be cancelled when the core job ends. Slurm is the in-memory FakeSlurm."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastic.config import JobConfig
from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.launch.slurm import SlurmLaunch, satellite_name
from slurm_elastic.testing.fakeslurm import FakeSlurm
from slurm_elastic.wire.channel import new_secret

pytestmark = pytest.mark.timeout(60)


def test_another_users_job_named_like_our_satellites_is_neither_counted_nor_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_ELASTIC_HOME", str(tmp_path / "home"))
    slurm = FakeSlurm("n[1-2]", partitions={"train": "n1", "spare": "n2"}, user="alice")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/sh\n")
    core = slurm.submit(script, args=["--nodes=1", "--partition=train"])
    slurm.start_pending()
    name = satellite_name(core)
    # Mallory's jobs, named like ours: one pending in the pool's partition, one running.
    pending = slurm.submit(script, args=[f"--job-name={name}", "--partition=train"], user="mallory")
    running = slurm.submit(script, args=[f"--job-name={name}", "--partition=spare"], user="mallory")
    slurm.start_pending()
    assert slurm.job(running).is_running and slurm.job(pending).is_pending

    launch = SlurmLaunch(JobConfig(), ["train"], slurm, core)
    coordinator = CoordinatorThread(CoordinatorConfig(job_id=core, secret=new_secret(), expected_workers=1)).start()
    launch.coordinator = coordinator
    coordinator.call(lambda: setattr(coordinator.coordinator, "pool_keep_pending", 1))
    try:
        launch._keep_pool()  # one of ours should be pending: mallory's is not ours
        ours = [j for j in slurm.jobs(name=name) if j.user == "alice"]
        assert len(ours) == 1 and ours[0].is_pending
        assert [j.job_id for j in launch.satellites()] == [ours[0].job_id]
        launch._keep_pool()  # and it is counted: no second one
        assert len([j for j in slurm.jobs(name=name) if j.user == "alice"]) == 1
    finally:
        launch.finish("finished")
    assert slurm.job(ours[0].job_id).state == "CANCELLED"
    assert slurm.job(pending).is_pending and slurm.job(running).is_running  # mallory's: untouched
