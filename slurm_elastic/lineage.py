"""Keep a node's process tree whole under its agent, so that Slurm's process tracking always finds it.

With `proctrack/linuxproc` Slurm finds a step's processes by their parent chain. A worker whose agent
died first would be re-parented to init, escape the step and keep running; a process that a worker
started and left behind would do the same. So: each worker dies with its agent (PR_SET_PDEATHSIG, bound
to the agent's main thread, which starts every worker), and the agent is a child subreaper: orphans below
it come back to it, are reaped by it (a zombie cannot be killed, only reaped) and killed when it ends.
Linux only; elsewhere these are no-ops.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Callable, Iterable

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _load_prctl() -> Callable[..., int] | None:
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()  # resolved before any fork: the child only calls it


def become_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it instead of to init."""
    return _prctl is not None and _prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive SIGKILL when the thread that forked it ends."""
    prctl = _prctl
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl: nothing would signal us
            os._exit(1)

    return preexec


def children(pid: int | None = None) -> set[int]:
    """The live children of `pid` (default: this process), from /proc."""
    pid = os.getpid() if pid is None else pid
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as fh:
                found.update(int(p) for p in fh.read().split())
    return found


def reap_adopted(workers: Iterable[int]) -> list[int]:
    """Reap exited children that are not our workers (whose watchers reap them); returns the pids reaped."""
    keep = set(workers)
    reaped: list[int] = []
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None or info.si_pid in keep:
            return reaped  # nothing exited, or a worker did: its watcher's wait() will take it
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, os.WNOHANG)
        reaped.append(info.si_pid)


def kill_adopted(workers: Iterable[int]) -> list[int]:
    """SIGKILL every child that is not one of our workers (orphans that came back to us); returns them."""
    keep = set(workers)
    killed = []
    for pid in children() - keep:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed
