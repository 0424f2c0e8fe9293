"""A node's process tree stays whole: workers die with their agent; orphans come back to it and are ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux-only")


def alive(pid: int) -> bool:
    """Running (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def helper(tmp_path: Path, body: str) -> tuple[subprocess.Popen[str], list[int]]:
    """Run `body` in a fresh interpreter that prints pids, one per line, then waits to be told to go on."""
    script = tmp_path / "helper.py"
    script.write_text(textwrap.dedent(body))
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = [int(x) for x in proc.stdout.readline().split()]
    return proc, pids


def end(proc: subprocess.Popen[str]) -> None:
    """Stop the helper if it still runs and close its pipes (an open pipe is reported as a leak)."""
    proc.kill()
    proc.wait(10)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def test_a_worker_dies_with_its_agent(tmp_path: Path) -> None:
    agent, (worker,) = helper(
        tmp_path,
        """
        import subprocess, sys
        from slurm_elastic.lineage import die_with_parent
        child = subprocess.Popen(["sleep", "600"], preexec_fn=die_with_parent())
        print(child.pid, flush=True)
        sys.stdin.read()
        """,
    )
    try:
        assert alive(worker)
        agent.send_signal(signal.SIGKILL)  # the agent alone: nothing else signals its worker
        agent.wait(10)
        assert wait_gone(worker), "the worker outlived its agent"
    finally:
        if alive(worker):
            os.kill(worker, signal.SIGKILL)
        end(agent)


def test_an_orphan_comes_back_to_the_agent_and_is_ended_and_reaped(tmp_path: Path) -> None:
    agent, (orphan,) = helper(
        tmp_path,
        """
        import subprocess, sys, time
        from slurm_elastic import lineage
        assert lineage.become_subreaper()
        # A worker that starts a background process and exits: the process is orphaned at once.
        out = subprocess.run(["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True).stdout
        orphan = int(out)
        print(orphan, flush=True)
        sys.stdin.readline()
        assert orphan in lineage.children(), "re-parented to the subreaper, not to init"
        assert lineage.kill_adopted([]) == [orphan]
        deadline = time.monotonic() + 5
        while orphan not in lineage.reap_adopted([]) and time.monotonic() < deadline:
            time.sleep(0.02)
        print("reaped" if orphan not in lineage.children() else "left", flush=True)
        """,
    )
    try:
        assert parent_of(orphan) == agent.pid
        assert agent.stdin is not None and agent.stdout is not None
        agent.stdin.write("go\n")
        agent.stdin.flush()
        assert agent.stdout.readline().strip() == "reaped"
        assert agent.wait(10) == 0
        assert not alive(orphan)
    finally:
        if alive(orphan):
            os.kill(orphan, signal.SIGKILL)
        end(agent)


def test_reap_leaves_the_workers_to_their_watchers(tmp_path: Path) -> None:
    agent, (status,) = helper(
        tmp_path,
        """
        import subprocess, time
        from slurm_elastic import lineage
        worker = subprocess.Popen(["sh", "-c", "exit 7"])
        time.sleep(0.3)
        lineage.reap_adopted([worker.pid])  # must not take the worker's exit status
        print(worker.wait(), flush=True)
        """,
    )
    try:
        assert status == 7
        agent.wait(10)
    finally:
        end(agent)
