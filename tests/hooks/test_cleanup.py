"""The Epilog's cleanup: only this job's processes on this node, and the cache dir without following links."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.hooks.cleanup import find_leftovers, is_leftover, kill_leftovers, read_environ, remove_job_cache
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
    assert kill_leftovers([target]) == []
    assert sleepers["target"].wait(5) == -9
    assert all(p.poll() is None for name, p in sleepers.items() if name != "target")


def test_kill_of_a_gone_process() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert kill_leftovers([proc.pid], wait_s=0.2) == []


def test_cache_removed(tmp_path: Path) -> None:
    (tmp_path / JOB / "shard").mkdir(parents=True)
    (tmp_path / JOB / "shard" / "data.bin").write_bytes(b"x")
    (tmp_path / "1").mkdir()
    assert remove_job_cache(str(tmp_path), JOB) == "removed"
    assert not (tmp_path / JOB).exists() and (tmp_path / "1").exists()
    assert remove_job_cache(str(tmp_path), JOB) == "absent"


def test_cache_symlink_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / JOB).symlink_to(victim)
    assert remove_job_cache(str(cache), JOB).startswith("refused")
    assert (victim / "precious").read_text() == "keep"


def test_symlinks_inside_the_cache_are_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    (tmp_path / "cache" / JOB).mkdir(parents=True)
    (tmp_path / "cache" / JOB / "link").symlink_to(victim)
    assert remove_job_cache(str(tmp_path / "cache"), JOB) == "removed"
    assert (victim / "precious").read_text() == "keep"


@pytest.mark.parametrize("job", ["../x", "", "1/2", "$(id)"])
def test_cache_job_id_is_validated(tmp_path: Path, job: str) -> None:
    with pytest.raises(HookInputError):
        remove_job_cache(str(tmp_path), job)
