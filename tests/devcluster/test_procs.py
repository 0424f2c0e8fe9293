"""Process discovery and stopping, on ordinary processes (no Slurm needed)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.testing.devcluster import procs
from slurm_elastic.testing.devcluster.layout import ENV_STATE_DIR, Layout, default_state_dir
from slurm_elastic.testing.devcluster.procs import Proc

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(sys.platform != "linux", reason="needs /proc")]


def test_descendants_is_transitive_and_excludes_roots() -> None:
    table = [Proc(10, 1, "S", ("a",)), Proc(11, 10, "S", ("b",)), Proc(12, 11, "S", ("c",)), Proc(13, 1, "S", ())]
    assert procs.descendants(table, [10]) == {11, 12}
    assert procs.descendants(table, [13]) == set()


def test_children_first_puts_every_process_before_its_ancestors() -> None:
    # 10 -> 11 -> 12, 10 -> 13; 20 alone; 30 not in the table. A parent killed first could orphan a stopped
    # child's process group, and the kernel would wake that child with SIGHUP before its own SIGKILL.
    table = [Proc(10, 1, "S", ()), Proc(11, 10, "S", ()), Proc(12, 11, "S", ()), Proc(13, 10, "S", ())]
    table += [Proc(20, 1, "S", ()), Proc(1, 0, "S", ())]
    order = procs.children_first(table, [10, 11, 12, 13, 20, 30])
    assert sorted(order) == [10, 11, 12, 13, 20, 30]
    for child, ancestor in [(12, 11), (11, 10), (12, 10), (13, 10)]:
        assert order.index(child) < order.index(ancestor), order


def test_protected_pids_hold_self_and_ancestors() -> None:
    protected = procs.protected_pids()
    assert {os.getpid(), os.getppid(), 1} <= protected


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        # Each runs in its own session: kill the whole group, children of `sh -c` included.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _spawn(spawned: list[subprocess.Popen[bytes]], script: str, env: dict[str, str] | None = None) -> int:
    proc = subprocess.Popen(["sh", "-c", script], env=env, start_new_session=True)
    spawned.append(proc)
    return proc.pid


def _wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_terminate_escalates_to_sigkill(spawned: list[subprocess.Popen[bytes]]) -> None:
    pid = _spawn(spawned, "trap '' TERM; while :; do sleep 0.1; done")
    time.sleep(0.3)  # let the shell install its trap
    left = procs.terminate([pid], grace_s=0.5, kill_wait_s=5.0)
    assert left == set()
    assert not procs.alive(pid)


def test_kill_at_once_and_descendants(spawned: list[subprocess.Popen[bytes]]) -> None:
    root = _spawn(spawned, "sleep 300 & sleep 300 & wait")
    _wait_for(lambda: len(procs.descendants(procs.list_procs(), [root])) == 2)
    children = procs.descendants(procs.list_procs(), [root])
    assert procs.kill_at_once({root, *children}) == set()
    assert not any(procs.alive(pid) for pid in {root, *children})


def test_read_environ_and_pid_file(tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    pid = _spawn(spawned, "exec sleep 300", env={**os.environ, "DEVCLUSTER_PROBE": "a=b"})
    _wait_for(lambda: procs.read_environ(pid).get("DEVCLUSTER_PROBE") == "a=b")
    (tmp_path / "x.pid").write_text(f"{pid}\n")
    assert procs.read_pid_file(tmp_path / "x.pid") == pid
    assert procs.read_pid_file(tmp_path / "missing.pid") is None


def test_node_pids_find_escaped_tasks_by_environment(tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    layout = Layout(tmp_path)
    task_env = {**os.environ, "SLURM_CONF": str(layout.slurm_conf), "SLURM_JOB_ID": "7"}
    on_n3 = _spawn(spawned, "exec sleep 300", env={**task_env, "SLURMD_NODENAME": "n3"})
    on_n1 = _spawn(spawned, "exec sleep 300", env={**task_env, "SLURMD_NODENAME": "n1"})
    # Same node name, but another cluster's slurm.conf: not ours.
    other = _spawn(spawned, "exec sleep 300", env={**task_env, "SLURMD_NODENAME": "n3", "SLURM_CONF": "/x.conf"})
    _wait_for(lambda: procs.read_environ(on_n3).get("SLURMD_NODENAME") == "n3")
    _wait_for(lambda: procs.read_environ(other).get("SLURM_CONF") == "/x.conf")
    found = layout.node_pids("n3")
    assert on_n3 in found
    assert on_n1 not in found and other not in found
    assert {on_n1, on_n3} <= layout.cluster_pids(["n1", "n2", "n3", "n4"])


def test_unix_socket_owner_found(tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    spool = tmp_path / "spool" / "n2"
    spool.mkdir(parents=True)
    script = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.bind({str(spool / 'n2_1.0')!r})\n"
        "s.listen()\n"
        "time.sleep(300)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    spawned.append(proc)
    _wait_for(lambda: proc.pid in procs.unix_socket_pids(spool))
    assert proc.pid not in procs.unix_socket_pids(tmp_path / "spool" / "n1")


def test_a_process_holding_a_file_open_is_found_by_the_files_identity_under_any_name(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "log" / "slurmd.n2.log"
    log.parent.mkdir()
    log.write_text("")
    (tmp_path / "elsewhere").symlink_to(tmp_path / "log")  # the name a chroot's process would show
    script = f"import time\nf = open({str(tmp_path / 'elsewhere' / log.name)!r}, 'a')\ntime.sleep(300)\n"
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    spawned.append(proc)
    _wait_for(lambda: proc.pid in procs.open_file_pids(log))
    other = tmp_path / "log" / "slurmd.n1.log"
    other.write_text("")
    assert proc.pid not in procs.open_file_pids(other) and not procs.open_file_pids(tmp_path / "absent.log")


def test_layout_paths_and_socket_room(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    assert layout.slurmd_log("n2") == tmp_path / "log" / "slurmd.n2.log"
    assert layout.spool("n2") == tmp_path / "spool" / "n2"
    assert not layout.socket_path_too_long()
    assert Layout(Path("/" + "d" * 90)).socket_path_too_long()


def test_default_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_STATE_DIR, str(tmp_path / "c"))
    assert default_state_dir() == tmp_path / "c"
    monkeypatch.delenv(ENV_STATE_DIR)
    assert default_state_dir().name == ".cluster"
