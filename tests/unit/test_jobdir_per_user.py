"""Job ids are predictable (Slurm's next number, a local id's time and pid), so in a home shared with other
users each job's directory lies in a directory of its user's own, `jobs/<user>/<job id>/`. Another user who
plants a directory, link or file at a job's id is ignored; one who takes the user's own directory first gets
the job refused in one line that names it, its owner and what to do, and nothing is written anywhere.
The other user is `nobody` (uid 65534): the tests run as root and give it what they plant."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_elastic.agent import _join_config
from slurm_elastic.config import JobConfig
from slurm_elastic.errors import ElasticError
from slurm_elastic.hooks.hookenv import handle_path_from_comment
from slurm_elastic.jobdir import (
    JobHandle,
    LaunchInfo,
    find_job,
    hook_comment,
    job_dir,
    make_job_dir,
    user_jobs,
    user_name,
)
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.launch.slurm import SlurmLaunch
from slurm_elastic.testing.fakeslurm import FakeSlurm
from slurm_elastic.wire.channel import new_secret

from .test_jobdir import NOBODY, snapshot

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="plants files of another user: needs root"),
]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]  # a training command that never registers


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home on a shared file system, as the admin guide says: the home and its `jobs/` sticky, 1777."""
    home = tmp_path / "shared"
    (home / "jobs").mkdir(parents=True)
    home.chmod(0o1777)
    (home / "jobs").chmod(0o1777)
    return home


def plant(path: Path, kind: str, target: Path) -> None:
    """What another user leaves at `path`: its own directory (open to all), a link to `target`, or a file."""
    if kind == "directory":
        path.mkdir()
        path.chmod(0o777)
        os.chown(path, NOBODY, NOBODY)
    elif kind == "link":
        path.symlink_to(target)
        os.lchown(path, NOBODY, NOBODY)
    else:
        path.write_text("")
        os.chown(path, NOBODY, NOBODY)


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """An `srun` that does nothing, for a launcher inside a (fake) allocation."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    return bin_dir


def test_every_job_lives_in_a_directory_of_its_users_own(home: Path) -> None:
    directory = make_job_dir(job_dir("7", home))
    assert directory == home / "jobs" / user_name() / "7" == user_jobs(home) / "7"
    for path in (directory.parent, directory):
        st = path.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
    # The hooks find the handle through the job's comment: the extra level keeps the shape they accept.
    assert handle_path_from_comment(hook_comment(directory)) == directory / "coordinator.json"


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "../7"])
def test_a_job_id_or_user_name_that_is_not_one_plain_name_is_refused(home: Path, bad: str) -> None:
    with pytest.raises(ElasticError, match="cannot name a directory: expected one name"):
        job_dir(bad, home)
    with pytest.raises(ElasticError, match="cannot name a directory"):
        job_dir("7", home, user=bad or ".")


@pytest.mark.parametrize("kind", ["directory", "link", "file"])
def test_a_local_job_is_not_stopped_by_a_name_planted_at_its_predictable_id(
    home: Path, tmp_path: Path, kind: str
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    plant(home / "jobs" / "local-planted", kind, theirs)  # where the job's files went until now
    before = snapshot(home, skip=home / "jobs" / user_name())
    job = LocalJob(SLEEPER, JobConfig(job_id="local-planted", nodes=1), root=home)
    try:
        job.start()
        assert JobHandle.read(job.dir).job_id == "local-planted"
    finally:
        job.stop()
    assert job.dir == home / "jobs" / user_name() / "local-planted"
    assert snapshot(home, skip=home / "jobs" / user_name()) == before  # what they planted: untouched
    assert list(theirs.iterdir()) == []


def test_a_slurm_job_leaves_a_directory_planted_at_its_id_alone(
    home: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_ELASTIC_HOME", str(home))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    slurm = FakeSlurm("n[1-2]", first_job_id=41)
    plant(home / "jobs" / "41", "directory", home)  # the next job id: anyone can guess it
    before = snapshot(home, skip=home / "jobs" / user_name())
    script = bin_dir / "job.sbatch"
    script.write_text("#!/bin/sh\n")
    job = slurm.submit(script, args=["--nodes=1"])
    slurm.start_pending()
    launch = SlurmLaunch(JobConfig(drain_grace_s=1.0), ["train"], slurm, job)
    try:
        launch.start()
        assert LaunchInfo.read(launch.dir).command == ["train"]
        assert find_job(job).job_id == job
    finally:
        launch.finish("finished")
    assert launch.dir == home / "jobs" / user_name() / "41"
    assert snapshot(home, skip=home / "jobs" / user_name()) == before  # never moved aside, never written


def test_a_slurm_jobs_own_old_directory_of_the_same_id_is_still_moved_aside(
    home: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reset controller hands out an id again: a fresh job never resumes the old job's state."""
    monkeypatch.setenv("SLURM_ELASTIC_HOME", str(home))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    slurm = FakeSlurm("n[1-2]", first_job_id=41)
    old = make_job_dir(job_dir("41", home))
    (old / "checkpoints").mkdir()
    script = bin_dir / "job.sbatch"
    script.write_text("#!/bin/sh\n")
    job = slurm.submit(script, args=["--nodes=1"])
    slurm.start_pending()
    launch = SlurmLaunch(JobConfig(drain_grace_s=1.0), ["train"], slurm, job)
    try:
        launch.start()
    finally:
        launch.finish("finished")
    moved = [p for p in old.parent.iterdir() if p.name.startswith("41.stale-")]
    assert len(moved) == 1 and (moved[0] / "checkpoints").is_dir()
    assert not (old / "checkpoints").exists()


@pytest.mark.parametrize("kind", ["directory", "link", "file"])
def test_a_user_directory_someone_else_made_first_is_refused_in_one_line(
    home: Path, tmp_path: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    ours = tmp_path / "ours"  # a link may even point at a directory of the user's: it is still refused
    ours.mkdir()
    squatted = home / "jobs" / user_name()
    plant(squatted, kind, ours)
    script = bin_dir / "job.sbatch"
    script.write_text("#!/bin/sh\n")
    before = snapshot(tmp_path)
    what = {"directory": "it is owned by uid 65534 (nobody), not by you (uid 0 (root))"}.get(
        kind, "it is a symbolic link or not a directory, owned by uid 65534 (nobody)"
    )
    expected = f"refusing to use {squatted}: {what}; someone else made it: have it removed, or set SLURM_ELASTIC_HOME"

    local_job = LocalJob(SLEEPER, JobConfig(job_id="local-1", nodes=1), root=home)
    try:
        with pytest.raises(ElasticError) as local:
            local_job.start()
    finally:
        local_job.stop()
    assert str(local.value).startswith(expected) and "\n" not in str(local.value)

    monkeypatch.setenv("SLURM_ELASTIC_HOME", str(home))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    slurm = FakeSlurm("n[1-2]")
    job = slurm.submit(script, args=["--nodes=1"])
    slurm.start_pending()
    launch = SlurmLaunch(JobConfig(), ["train"], slurm, job)
    try:
        with pytest.raises(ElasticError) as in_slurm:
            launch.start()
    finally:
        if launch.coordinator is not None:
            launch.finish("failed")
    assert str(in_slurm.value).startswith(expected)
    assert launch.coordinator is None and slurm.job(job).comment == ""
    assert snapshot(tmp_path) == before  # nothing written, here or through their link


def test_run_local_in_a_squatted_home_ends_with_one_error_line(home: Path) -> None:
    squatted = home / "jobs" / user_name()
    plant(squatted, "directory", home)
    env = {**os.environ, "SLURM_ELASTIC_HOME": str(home)}
    argv = [sys.executable, "-m", "slurm_elastic", "run", "--local", "--", sys.executable, "-c", "pass"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith(f"slurm-elastic: error: refusing to use {squatted}: it is owned by uid 65534")
    assert len(done.stderr.splitlines()) == 1, done.stderr  # no traceback
    assert list(squatted.iterdir()) == []


def test_readers_find_the_job_in_its_users_directory(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`status`, `reclaim`, `grow` (find_job) and a satellite's `agent --join` read the per-user directory."""
    monkeypatch.setenv("SLURM_ELASTIC_HOME", str(home))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    directory = make_job_dir(job_dir("7", home))
    handle = JobHandle("7", "127.0.0.1:4242", new_secret(), "n1", 1, 1.0)
    handle.write(directory)
    LaunchInfo(["python", "train.py"], 2, 3, 60.0, 1.0, {"A": "1"}).write(directory)
    assert find_job("7") == handle
    config = _join_config("7", "n9", [])
    assert (config.coordinator, config.secret, config.nproc, config.command) == (
        handle.address,
        handle.secret,
        2,
        ["python", "train.py"],
    )


def test_a_job_left_in_the_old_layout_is_named_in_the_error(home: Path) -> None:
    legacy = home / "jobs" / "8"
    legacy.mkdir()
    JobHandle("8", "127.0.0.1:1", new_secret(), "n1", 1, 1.0).write(legacy)
    with pytest.raises(ElasticError, match=rf"no job '8' under {home}/jobs/root; {legacy} is where versions before"):
        find_job("8", home)


def test_root_reads_another_users_job_only_from_a_directory_of_that_user(home: Path) -> None:
    """`status --user daemon` as root: jobs/daemon must be daemon's (uid 1); one that nobody made is refused,
    and so is a handle that names another job."""
    theirs = home / "jobs" / "daemon"
    (theirs / "7").mkdir(parents=True, mode=0o700)
    forged = JobHandle("7", "10.6.6.6:1", new_secret(), "evil", 1, 1.0)
    forged.write(theirs / "7")
    for path in (theirs, theirs / "7", theirs / "7" / "coordinator.json"):
        os.chown(path, NOBODY, NOBODY)
    with pytest.raises(ElasticError, match=rf"refusing to use {theirs}: it is owned by uid 65534 \(nobody\), not by"):
        find_job("7", home, user="daemon")
    for path in (theirs, theirs / "7", theirs / "7" / "coordinator.json"):
        os.chown(path, 1, 1)
    assert find_job("7", home, user="daemon") == forged  # daemon's own job: root may read it
    (theirs / "9").mkdir(mode=0o700)
    os.chown(theirs / "9", 1, 1)
    (theirs / "9" / "coordinator.json").write_text(json.dumps(forged.__dict__))
    (theirs / "9" / "coordinator.json").chmod(0o600)
    with pytest.raises(ElasticError, match="is the handle of job '7', not of '9'"):
        find_job("9", home, user="daemon")
