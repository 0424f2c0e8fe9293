"""The real Prolog, HealthCheckProgram and Epilog entry points, run as root (a fake Slurm client), on a node
where another user (nobody, uid 65534) planted something in the data cache path before any hook made it:
a symbolic link to a directory of root's, a directory of its own, or a file. Root must not follow, chmod,
write, delete or drain because of it: the job is accepted, the node stays up, and nothing outside the hooks'
own log and state directories changes. Without the plant, the hooks make the cache as before."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic.hooks import base, epilog, healthcheck, prolog
from slurm_elastic.slurm.records import NodeInfo

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root; the plants belong to another user"),
]
NOBODY = 65534
JOB = "100"


class FakeSlurm:
    def __init__(self) -> None:
        self.updates: list[tuple[str, str, str]] = []

    def job(self, job_id: str) -> None:
        return None

    def node(self, name: str) -> NodeInfo:
        return NodeInfo(name, "IDLE")

    def running_jobs_on(self, node: str) -> list[tuple[str, int]]:
        return []

    def set_node_state(self, node: str, state: str, reason: str) -> None:
        self.updates.append((node, state, reason))

    def spool_dir(self) -> str:
        return "/tmp"


def snapshot(root: Path, skip: tuple[Path, ...]) -> dict[str, tuple[int, int, bytes]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if any(path == s or s in path.parents for s in skip):
                continue
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                content = path.read_bytes()
            else:
                content = os.readlink(path).encode() if stat.S_ISLNK(st.st_mode) else b""
            out[str(path)] = (st.st_uid, st.st_mode, content)
    return out


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    shm = tmp_path / "shm"
    shm.mkdir()
    shm.chmod(0o1777)  # like /dev/shm
    victim = tmp_path / "victim"  # root's, e.g. /etc
    (victim / "n3" / JOB).mkdir(parents=True)
    (victim / "n3" / JOB / "precious").write_text("keep")
    (victim / "precious").write_text("keep")
    hooks_dir = tmp_path / "hooks"
    hooks_dir.mkdir()
    settings = {
        "log_dir": tmp_path / "log",
        "state_dir": tmp_path / "state",
        "cache_dir": shm / "slurm-elastic" / "%n",
    }
    text = "".join(f'{k} = "{v}"\n' for k, v in settings.items())
    text += 'syslog = false\ncheck_gpus = "no"\nmin_free_shm_mb = 0\nmin_free_spool_mb = 0\n'
    (hooks_dir / "hooks.toml").write_text(text)
    fake = FakeSlurm()
    for module in (prolog, epilog, healthcheck):
        monkeypatch.setattr(module, "HookSlurm", lambda **_: fake)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    env = {
        "SLURM_ELASTIC_HOOKS_DIR": str(hooks_dir),
        "SLURM_JOB_ID": JOB,
        "SLURM_JOB_UID": str(NOBODY),
        "SLURMD_NODENAME": "n3",
        "SLURM_NODELIST": "n3",
    }
    own = (tmp_path / "log", tmp_path / "state")
    return {"tmp": tmp_path, "shm": shm, "victim": victim, "fake": fake, "env": env, "own": own}


def plant(node: dict[str, Any], kind: str) -> None:
    planted: Path = node["shm"] / "slurm-elastic"
    if kind == "link":
        planted.symlink_to(node["victim"])
        os.lchown(planted, NOBODY, NOBODY)
    elif kind == "directory":
        (planted / "n3" / JOB).mkdir(parents=True)
        (planted / "n3" / JOB / "mine").write_text("the user's")
        for path in (planted, planted / "n3", planted / "n3" / JOB, planted / "n3" / JOB / "mine"):
            os.chown(path, NOBODY, NOBODY)
        planted.chmod(0o777)
    else:
        planted.write_text("")
        os.chown(planted, NOBODY, NOBODY)


def run_hooks(node: dict[str, Any]) -> list[int]:
    env = node["env"]
    codes = [base.main("prolog", lambda _: prolog.run(env))]
    codes.append(base.main("healthcheck", lambda _: healthcheck.run(env)))
    codes.append(base.main("epilog", lambda _: epilog.run(env)))
    return codes


def log(node: dict[str, Any]) -> str:
    path: Path = node["tmp"] / "log" / "hooks.log"
    return path.read_text() if path.exists() else ""


@pytest.mark.parametrize("kind", ["link", "directory", "file"])
def test_a_plant_in_the_cache_path_changes_nothing_and_drains_nothing(node: dict[str, Any], kind: str) -> None:
    plant(node, kind)
    before = snapshot(node["tmp"], node["own"])
    assert run_hooks(node) == [base.EX_OK, base.EX_OK, base.EX_OK]  # the job is accepted
    assert node["fake"].updates == []  # no drain, no FAIL
    assert snapshot(node["tmp"], node["own"]) == before  # no chmod, no file, nothing removed
    lines = log(node)
    assert "prolog job=100 node=n3 action=cache result=refused" in lines
    assert "healthcheck node=n3 action=cache result=refused" in lines
    assert "uid 65534" in lines
    assert 'action=cleanup result=partial killed=0 cache="refused: ' in lines


def test_without_a_plant_the_hooks_make_and_clean_the_cache(node: dict[str, Any]) -> None:
    env = node["env"]
    assert base.main("prolog", lambda _: prolog.run(env)) == base.EX_OK
    cache: Path = node["shm"] / "slurm-elastic" / "n3"
    st = cache.stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o1777
    assert stat.S_IMODE((node["shm"] / "slurm-elastic").stat().st_mode) == 0o755
    (cache / JOB).mkdir()
    (cache / JOB / "copy").write_text("x")
    for path in (cache / JOB, cache / JOB / "copy"):
        os.chown(path, NOBODY, NOBODY)
    assert base.main("epilog", lambda _: epilog.run(env)) == base.EX_OK
    assert not (cache / JOB).exists() and cache.is_dir()
    assert "action=cleanup result=ok killed=0 cache=removed" in log(node)
    assert node["fake"].updates == []
