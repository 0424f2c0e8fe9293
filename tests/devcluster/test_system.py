"""Machine set-up helpers, exercised without touching the real /etc/munge or apt."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from slurm_elastic.testing.devcluster import system
from slurm_elastic.testing.devcluster.conf import SlurmVersion
from slurm_elastic.testing.devcluster.shell import ClusterError, find_binary, run

pytestmark = pytest.mark.timeout(30)


def test_munge_key_created_owned_and_0400(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = tmp_path / "munge" / "munge.key"
    monkeypatch.setattr(system, "MUNGE_KEY", key)
    me = pwd.getpwuid(os.getuid())
    system._ensure_key(me)
    info = key.stat()
    assert stat.S_IMODE(info.st_mode) == 0o400
    assert (info.st_uid, info.st_gid) == (me.pw_uid, me.pw_gid)
    assert info.st_size == 1024
    before = key.read_bytes() if os.access(key, os.R_OK) else None
    system._ensure_key(me)  # an existing key is kept
    assert key.stat().st_ino == info.st_ino
    if before is not None:
        assert key.read_bytes() == before


def test_missing_packages_without_root_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system, "missing_binaries", lambda: ["slurmd", "sinfo"])
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match=r"slurmd, sinfo not installed.*apt-get install munge slurmctld"):
        system.ensure_packages(tmp_path)


def test_nothing_to_install_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system, "missing_binaries", lambda: [])
    system.ensure_packages(tmp_path)
    assert not (tmp_path / "apt.log").exists()


def test_run_reports_failure_timeout_and_missing_binary(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=r"exited with 3: boom; see /x.log"):
        run(["sh", "-c", "echo boom >&2; exit 3"], log=Path("/x.log"))
    with pytest.raises(ClusterError, match=r"did not finish within 0\.2 s"):
        run(["sleep", "5"], timeout_s=0.2)
    with pytest.raises(ClusterError, match="is not installed"):
        run([str(tmp_path / "no-such-binary")])
    assert run(["sh", "-c", "exit 4"], check=False).returncode == 4


@pytest.mark.skipif(find_binary("slurmctld") is None, reason="Slurm is not installed")
def test_installed_version_is_read() -> None:
    assert system.slurm_version() >= SlurmVersion(20, 2)
