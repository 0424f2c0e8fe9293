"""Find and stop processes through /proc: the local cluster's daemons, step daemons and job tasks.

Linux only. A zombie counts as gone: in some containers PID 1 reaps orphans late.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from slurm_elastic.waiting import holds_within

T = TypeVar("T")

__all__ = [
    "Proc",
    "alive",
    "children_first",
    "descendants",
    "kill_at_once",
    "list_procs",
    "open_file_pids",
    "protected_pids",
    "read_environ",
    "read_pid_file",
    "terminate",
    "unix_socket_pids",
    "wait_gone",
]

_PROC = Path("/proc")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        """Basename of argv[0] ('slurmd'), or the title a daemon set ('slurmstepd: [3.0]' -> 'slurmstepd:')."""
        return os.path.basename(self.argv[0]) if self.argv else ""


def _read_stat(pid: int) -> tuple[str, int] | None:
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces: split after the last ')'.
    fields = text[text.rfind(")") + 2 :].split()
    if len(fields) < 2:
        return None
    return fields[0], int(fields[1])


def list_procs() -> list[Proc]:
    procs = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _read_stat(pid)
        if stat is None:
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        argv = tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)
        procs.append(Proc(pid=pid, ppid=stat[1], state=stat[0], argv=argv))
    return procs


def alive(pid: int) -> bool:
    stat = _read_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def read_environ(pid: int) -> dict[str, str]:
    """The process's environment; empty when it is gone or unreadable."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            env[key] = value
    return env


def read_pid_file(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def descendants(procs: Iterable[Proc], roots: Iterable[int]) -> set[int]:
    """Every process below `roots` in the parent tree (roots excluded)."""
    children: dict[int, list[int]] = {}
    for proc in procs:
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def protected_pids() -> set[int]:
    """This process and its ancestors: never signalled, whatever their environment says."""
    protected = {0, 1}
    pid = os.getpid()
    while pid > 1 and pid not in protected:
        protected.add(pid)
        stat = _read_stat(pid)
        pid = stat[1] if stat else 0
    return protected


def unix_socket_pids(directory: Path) -> set[int]:
    """Processes holding a Unix socket bound under `directory` (slurmstepd binds one in its node's spool)."""
    prefix = str(directory).rstrip("/") + "/"
    inodes: set[str] = set()
    try:
        lines = (_PROC / "net" / "unix").read_text().splitlines()[1:]
    except OSError:
        return set()
    for line in lines:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith(prefix):
            inodes.add(fields[6])
    if not inodes:
        return set()
    wanted = {f"socket:[{inode}]" for inode in inodes}
    return {pid for pid in _pids() if any(link in wanted for link in _fd_links(pid))}


def open_file_pids(path: Path) -> set[int]:
    """Processes with `path` open (slurmstepd keeps its node's slurmd log open). Matched by file identity,
    not by name: a process in a chroot may show its open files by their names outside it."""
    try:
        st = path.stat()
    except OSError:
        return set()
    target = (st.st_dev, st.st_ino)
    return {pid for pid in _pids() if target in _fd_files(pid)}


def _pids() -> list[int]:
    return [int(e.name) for e in _PROC.iterdir() if e.name.isdigit()]


def _fd_links(pid: int) -> set[str]:
    return _each_fd(pid, os.readlink)


def _fd_files(pid: int) -> set[tuple[int, int]]:
    """(device, inode) of each file `pid` has open (stat follows the link to the open file itself)."""
    return _each_fd(pid, lambda fd: ((st := fd.stat()).st_dev, st.st_ino))


def _each_fd(pid: int, read: Callable[[Path], T]) -> set[T]:
    """`read` of each of `pid`'s open descriptors, skipping those closed meanwhile."""
    try:
        entries = list((_PROC / str(pid) / "fd").iterdir())
    except OSError:
        return set()
    found: set[T] = set()
    for entry in entries:
        with contextlib.suppress(OSError):
            found.add(read(entry))
    return found


def _signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_gone(pids: Iterable[int], timeout_s: float) -> set[int]:
    """Wait until none of `pids` is alive; return those still alive at the deadline."""
    left = {pid for pid in pids if alive(pid)}

    def gone() -> bool:
        left.intersection_update({pid for pid in left if alive(pid)})
        return not left

    holds_within(gone, timeout=timeout_s, poll=0.1)
    return left


def terminate(pids: Iterable[int], *, grace_s: float = 5.0, kill_wait_s: float = 5.0) -> set[int]:
    """SIGTERM, wait up to grace_s, SIGKILL the rest, wait up to kill_wait_s; return survivors."""
    targets = set(pids) - protected_pids()
    _signal(targets, signal.SIGTERM)
    left = wait_gone(targets, grace_s)
    _signal(left, signal.SIGKILL)
    return wait_gone(left, kill_wait_s)


def kill_at_once(pids: Iterable[int], *, wait_s: float = 5.0) -> set[int]:
    """Stop all, then SIGKILL all, each before its parent: none of them can react to the others' death (a
    node that dies). Children first because a parent's death can orphan a stopped child's process group,
    which the kernel then wakes with SIGHUP and SIGCONT: a child not yet sent its SIGKILL runs its handler
    (srun did, and killed its step on every other node)."""
    targets = set(pids) - protected_pids()
    _signal(targets, signal.SIGSTOP)
    _signal(children_first(list_procs(), targets), signal.SIGKILL)
    return wait_gone(targets, wait_s)


def children_first(table: Iterable[Proc], pids: Iterable[int]) -> list[int]:
    """`pids` ordered so that every process comes before its ancestors (deepest in the parent tree first)."""
    parent = {p.pid: p.ppid for p in table}

    def depth(pid: int) -> int:
        seen = 0
        while pid in parent and seen < len(parent):  # bounded: a table read while pids were reused may loop
            pid, seen = parent[pid], seen + 1
        return seen

    return sorted(pids, key=depth, reverse=True)
