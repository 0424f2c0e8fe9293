"""A job's directory and its files in a home shared with other users: what another user planted there is
never written through, a directory that is not ours is refused, and readers accept only our private files.
The other user is `nobody` (uid 65534): the tests run as root and give it the planted files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.errors import ElasticError
from slurm_elastic.events import EventLog
from slurm_elastic.jobdir import HANDLE, JobHandle, LaunchInfo, private_dir, read_private
from slurm_elastic.wire.channel import new_secret

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(os.geteuid() != 0, reason="plants files of another user: needs root"),
]
NOBODY = 65534
HANDLE_OBJ = JobHandle("77", "127.0.0.1:4242", new_secret(), "n1", 123, 1.5)
INFO = LaunchInfo(["python", "train.py"], 1, 3, 60.0, 1.0, {"A": "1"})


def snapshot(root: Path, skip: Path | None = None) -> dict[str, tuple[int, int, int, bytes]]:
    """Every path under `root` (not following links) with its owner, mode, size and content."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if skip is not None and (path == skip or skip in path.parents):
                continue
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                content = path.read_bytes()
            else:
                content = os.readlink(path).encode() if stat.S_ISLNK(st.st_mode) else b""
            out[str(path)] = (st.st_uid, st.st_mode, st.st_size, content)
    return out


@pytest.fixture
def shared_home(tmp_path: Path) -> Path:
    """A home on a shared file system: world-writable and sticky, like /tmp."""
    home = tmp_path / "shared"
    home.mkdir()
    home.chmod(0o1777)
    (home / "jobs").mkdir()
    (home / "jobs").chmod(0o1777)
    return home


@pytest.mark.parametrize("planted", ["symlink to our file", "file of another user"])
def test_a_pre_created_coordinator_tmp_is_never_written_through(shared_home: Path, planted: str) -> None:
    job = shared_home / "jobs" / "77"
    job.mkdir()
    job.chmod(0o777)  # made by a launcher under umask 000: others could plant names in it until now
    victim = shared_home / "victim.txt"
    victim.write_text("precious")
    tmp = job / "coordinator.tmp"
    if planted.startswith("symlink"):
        tmp.symlink_to(victim)
        os.lchown(tmp, NOBODY, NOBODY)
    else:
        tmp.write_text("")
        tmp.chmod(0o666)
        os.chown(tmp, NOBODY, NOBODY)
    before = snapshot(shared_home, skip=job)
    planted_before = snapshot(job)

    path = HANDLE_OBJ.write(job)

    assert snapshot(shared_home, skip=job) == before  # nothing outside the job's directory changed
    assert victim.read_text() == "precious"
    assert {k: v for k, v in snapshot(job).items() if k == str(tmp)} == planted_before  # untouched
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    assert json.loads(path.read_text())["secret"] == HANDLE_OBJ.secret
    assert stat.S_IMODE(job.stat().st_mode) == 0o700  # no one else plants anything from now on
    assert JobHandle.read(job) == HANDLE_OBJ
    leftovers = sorted(p.name for p in job.iterdir())
    assert leftovers == ["coordinator.json", "coordinator.tmp"]  # no temporary file of ours is left


def test_a_job_directory_of_another_user_is_refused(shared_home: Path) -> None:
    job = shared_home / "jobs" / "77"
    job.mkdir()
    os.chown(job, NOBODY, NOBODY)
    job.chmod(0o777)
    with pytest.raises(
        ElasticError,
        match=rf"refusing to use {job}: it is owned by uid 65534 \(nobody\), not by you \(uid 0 \(root\)\)",
    ):
        HANDLE_OBJ.write(job)
    with pytest.raises(ElasticError, match="owned by uid 65534"):
        INFO.write(job)
    assert list(job.iterdir()) == []


def test_a_job_directory_that_is_a_link_is_refused(shared_home: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (shared_home / "jobs" / "77").symlink_to(elsewhere)
    with pytest.raises(ElasticError, match="it is a symbolic link or not a directory"):
        HANDLE_OBJ.write(shared_home / "jobs" / "77")
    assert list(elsewhere.iterdir()) == []


def test_a_jobs_directory_others_may_replace_entries_of_is_refused(tmp_path: Path) -> None:
    jobs = tmp_path / "home" / "jobs"
    jobs.mkdir(parents=True)
    jobs.chmod(0o777)  # world-writable, not sticky: anyone could rename our job directory away
    with pytest.raises(ElasticError, match=r"others may write to it \(drwxrwxrwx\) and it is not sticky"):
        private_dir(jobs / "77")
    jobs.chmod(0o755)
    os.chown(jobs, NOBODY, NOBODY)
    with pytest.raises(ElasticError, match=r"owned by uid 65534 \(nobody\), not by you"):
        private_dir(jobs / "77")


def test_a_fresh_job_directory_is_owner_only(tmp_path: Path) -> None:
    job = tmp_path / "home" / "jobs" / "7"
    INFO.write(job)
    assert stat.S_IMODE(job.stat().st_mode) == 0o700
    assert LaunchInfo.read(job) == INFO
    assert stat.S_IMODE((job / "launch.json").stat().st_mode) == 0o600


@pytest.mark.parametrize("problem", ["symlink", "group readable", "fifo"])
def test_readers_accept_only_our_private_regular_files(tmp_path: Path, problem: str) -> None:
    job = tmp_path / "jobs" / "77"
    HANDLE_OBJ.write(job)
    INFO.write(job)
    handle, launch = job / HANDLE, job / "launch.json"
    if problem == "symlink":
        real = tmp_path / "forged.json"
        real.write_text(json.dumps({**HANDLE_OBJ.__dict__, "address": "10.6.6.6:1"}))
        real.chmod(0o600)
        for path in (handle, launch):
            path.unlink()
            path.symlink_to(real)
        error = "it is a symbolic link"
    elif problem == "group readable":
        for path in (handle, launch):
            path.chmod(0o640)
        error = r"its mode is -rw-r-----; it must be private to its owner \(0600\)"
    else:
        for path in (handle, launch):
            path.unlink()
            os.mkfifo(path, 0o600)
        error = "it is not a regular file"
    with pytest.raises(ElasticError, match=error):
        JobHandle.read(job)
    with pytest.raises(ElasticError, match=error):
        LaunchInfo.read(job)


def test_a_private_file_of_another_user_is_refused_to_a_user(tmp_path: Path) -> None:
    """A user's tools read only that user's files (root, reading for admins' tools, may read anyone's)."""
    from slurm_elastic.jobdir import check_private_stat

    path = tmp_path / "f"
    path.write_text("{}")
    path.chmod(0o600)
    st = path.stat()
    check_private_stat(path, st, st.st_uid)  # ours: fine
    with pytest.raises(ElasticError, match=r"it is owned by uid 0, not by you \(uid 1000\)"):
        check_private_stat(path, st, 1000)
    assert read_private(path) == b"{}"


def test_a_planted_events_link_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    job = tmp_path / "jobs" / "7"
    job.mkdir(parents=True)
    (job / "events.jsonl").symlink_to(victim)
    log = EventLog("7", job / "events.jsonl")
    log.emit("x", quiet=True)  # reported, never written through the link (and never fatal)
    failed = [e for e in log.all() if e["event"] == "events_write_failed"]
    assert failed and "Too many levels of symbolic links" in failed[0]["error"]
    assert victim.read_text() == "keep"


def test_a_coordinator_refuses_a_job_directory_of_another_user(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "7"
    job.mkdir(parents=True)
    os.chown(job, NOBODY, NOBODY)
    config = CoordinatorConfig(job_id="7", secret=new_secret(), expected_workers=1, events_path=job / "events.jsonl")
    with pytest.raises(ElasticError, match="owned by uid 65534"):
        CoordinatorThread(config)
    assert list(job.iterdir()) == []
