"""The Epilog's cleanup: only this job's processes on this node, and the cache dir without following links."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.hooks.cleanup import (
    find_leftovers,
    is_leftover,
    kill_leftovers,
    proc_uids,
    read_environ,
    remove_job_cache,
)
from slurm_elastic.hooks.hookenv import HookInputError

JOB = "987654"
TASK = {"SLURM_JOB_ID": JOB, "SLURMD_NODENAME": "n3", "SLURM_ELASTIC_SECRET": "x"}


def test_leftover_rules() -> None:
    assert is_leftover(TASK, 1000, JOB, "n3", 1000)
    assert not is_leftover(TASK, 0, JOB, "n3", 1000)  # another user's process (root's) is never killed
    assert not is_leftover(TASK, 1000, "1", "n3", 1000)
    assert not is_leftover(TASK, 1000, JOB, "n4", 1000)  # the same job on another node of one machine
    assert not is_leftover({**TASK, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}, 1000, JOB, "n3", 1000)
    plain = {k: v for k, v in TASK.items() if not k.startswith("SLURM_ELASTIC_")}
    assert not is_leftover(plain, 1000, JOB, "n3", 1000)  # not an elastic job's process


@pytest.fixture
def sleepers() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    envs = {
        "target": {**base, **TASK},
        "other_node": {**base, **TASK, "SLURMD_NODENAME": "n4"},
        "not_elastic": {**base, "SLURM_JOB_ID": JOB, "SLURMD_NODENAME": "n3"},
        "hook": {**base, **TASK, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"},
    }
    procs = {name: subprocess.Popen(["sleep", "60"], env=env) for name, env in envs.items()}
    try:
        yield procs
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_finds_and_kills_only_this_jobs_processes_on_this_node(sleepers: dict[str, subprocess.Popen[bytes]]) -> None:
    target = sleepers["target"].pid
    assert read_environ(target)["SLURMD_NODENAME"] == "n3"
    assert find_leftovers(JOB, "n3", os.getuid()) == [target]
    assert kill_leftovers([target], JOB, "n3", os.getuid()) == []
    assert sleepers["target"].wait(5) == -9
    assert all(p.poll() is None for name, p in sleepers.items() if name != "target")


def test_kill_of_a_gone_process() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert kill_leftovers([proc.pid], JOB, "n3", os.getuid(), wait_s=0.2) == []


def test_cache_removed(tmp_path: Path) -> None:
    (tmp_path / JOB / "shard").mkdir(parents=True)
    (tmp_path / JOB / "shard" / "data.bin").write_bytes(b"x")
    (tmp_path / "1").mkdir()
    assert remove_job_cache(str(tmp_path), JOB, os.getuid()) == "removed"
    assert not (tmp_path / JOB).exists() and (tmp_path / "1").exists()
    assert remove_job_cache(str(tmp_path), JOB, os.getuid()) == "absent"


def test_cache_symlink_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / JOB).symlink_to(victim)
    assert remove_job_cache(str(cache), JOB, os.getuid()).startswith("refused")
    assert (victim / "precious").read_text() == "keep"


def test_symlinks_inside_the_cache_are_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    (tmp_path / "cache" / JOB).mkdir(parents=True)
    (tmp_path / "cache" / JOB / "link").symlink_to(victim)
    assert remove_job_cache(str(tmp_path / "cache"), JOB, os.getuid()) == "removed"
    assert (victim / "precious").read_text() == "keep"


@pytest.mark.parametrize("job", ["../x", "", "1/2", "$(id)"])
def test_cache_job_id_is_validated(tmp_path: Path, job: str) -> None:
    with pytest.raises(HookInputError):
        remove_job_cache(str(tmp_path), job, os.getuid())


# --- as root, against what another user planted (uid 65534, `nobody`, plays the job's user or the attacker) ---

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="starts processes of other users: needs root")


def _sleeper(env: dict[str, str], uids: tuple[int, int, int] | None) -> subprocess.Popen[bytes]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return subprocess.Popen(
        ["sleep", "60"], env={**base, **env}, preexec_fn=(lambda: os.setresuid(*uids)) if uids else None
    )


@needs_root
def test_only_a_process_that_is_still_the_jobs_is_killed() -> None:
    """The scan found these pids; by the time of the kill each may name another process (a reused pid)."""
    procs = {
        "job's": _sleeper(TASK, (NOBODY, NOBODY, NOBODY)),
        "another user's, same env": _sleeper(TASK, None),  # root's: what a reused pid could name
        "set-uid program of the job's user": _sleeper(TASK, (NOBODY, 0, NOBODY)),
        "the job user's, not the job": _sleeper({"SLURM_JOB_ID": "1", "SLURM_ELASTIC_X": "1"}, (NOBODY,) * 3),
    }
    try:
        time.sleep(0.2)  # each has exec'd sleep with its uids
        assert kill_leftovers([p.pid for p in procs.values()], JOB, "n3", NOBODY) == []
        assert procs["job's"].wait(5) == -9
        assert all(p.poll() is None for name, p in procs.items() if name != "job's")
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


@needs_root
def test_proc_uids() -> None:
    proc = _sleeper({}, (NOBODY, 0, NOBODY))
    try:
        time.sleep(0.1)
        assert proc_uids(proc.pid) == (NOBODY, 0, 0, 0)  # exec copies the effective uid to the saved one
    finally:
        proc.kill()
        proc.wait()
    assert proc_uids(proc.pid) is None


@needs_root
def test_a_job_directory_of_another_user_is_not_removed(tmp_path: Path) -> None:
    (tmp_path / JOB).mkdir()
    os.chown(tmp_path / JOB, NOBODY, NOBODY)
    result = remove_job_cache(str(tmp_path), JOB, 1000)
    assert result == f"refused: {tmp_path}/{JOB} is owned by uid 65534, not by the job's user (uid 1000)"
    assert (tmp_path / JOB).is_dir()
    assert remove_job_cache(str(tmp_path), JOB, NOBODY) == "removed"


@needs_root
@pytest.mark.parametrize("plant", ["link", "directory"])
def test_a_cache_path_through_a_users_plant_is_not_touched(tmp_path: Path, plant: str) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    shm.chmod(0o1777)  # like /dev/shm: anyone may create names here
    victim = tmp_path / "victim"
    (victim / "n3" / JOB).mkdir(parents=True)
    (victim / "n3" / JOB / "precious").write_text("keep")
    planted = shm / "slurm-elastic"
    if plant == "link":
        planted.symlink_to(victim)
        os.lchown(planted, NOBODY, NOBODY)
    else:
        (planted / "n3" / JOB).mkdir(parents=True)
        for path in (planted, planted / "n3"):
            os.chown(path, NOBODY, NOBODY)
        os.chown(planted / "n3" / JOB, NOBODY, NOBODY)
    result = remove_job_cache(str(planted / "n3"), JOB, NOBODY)
    assert result.startswith("refused: ") and "65534" in result
    assert (victim / "n3" / JOB / "precious").read_text() == "keep"
    if plant == "directory":
        assert (planted / "n3" / JOB).is_dir()
