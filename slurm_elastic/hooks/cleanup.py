"""What the Epilog leaves clean on a node that a job left: the job's data cache directory, and any
process of the job that escaped Slurm's process tracking (a worker that daemonised itself).

A process is the job's when it runs as the job's user and its environment says SLURM_JOB_ID=<job>,
SLURMD_NODENAME=<this node> and holds a SLURM_ELASTIC_* variable: the node name matters where several
slurmds share one machine (the local test cluster), so that a shrink never kills the job elsewhere.
A pid found by the scan is killed through a pidfd opened afterwards, and only once the process that
pidfd names is checked again (its uids and environment): a pid reused meanwhile by another process,
of anyone, is never signalled.

The cache directory is reached through root's directories only (hooks.safedir), and a job's directory
in it is removed only when it is a real directory of the job's user, through descriptors (rmtree with
dir_fd): a user's planted link or directory never makes root delete anything else.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from slurm_elastic.hooks.hookenv import parse_job_id
from slurm_elastic.hooks.safedir import UnsafePath, open_root_dir

__all__ = ["find_leftovers", "is_leftover", "kill_leftovers", "proc_uids", "read_environ", "remove_job_cache"]

_ENV_LIMIT = 1024 * 1024


def is_leftover(environ: Mapping[str, str], proc_uid: int, job_id: str, node: str, uid: int) -> bool:
    if proc_uid != uid:
        return False
    if environ.get("SLURM_JOB_ID") != job_id or environ.get("SLURMD_NODENAME") != node:
        return False
    if "SLURM_SCRIPT_CONTEXT" in environ:
        return False  # a prolog or epilog (this one, say), not a task
    return any(key.startswith("SLURM_ELASTIC_") for key in environ)


def read_environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read(_ENV_LIMIT)
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _ancestors(pid: int) -> set[int]:
    found = set()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def find_leftovers(job_id: str, node: str, uid: int, proc: Path = Path("/proc")) -> list[int]:
    """Pids of the job's processes still on this node (never this process or its ancestors)."""
    mine = _ancestors(os.getpid())
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            owner = entry.stat().st_uid
        except OSError:
            continue
        if is_leftover(read_environ(int(entry.name)), owner, job_id, node, uid):
            found.append(int(entry.name))
    return sorted(found)


def proc_uids(pid: int) -> tuple[int, ...] | None:
    """(real, effective, saved, filesystem) uids of a process, from /proc/<pid>/status; None if gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return tuple(int(v) for v in line.split()[1:5])
    except (OSError, ValueError):
        return None
    return None


def _still_the_jobs(pid: int, job_id: str, node: str, uid: int) -> bool:
    """Checked after the pidfd is open: every uid of the process is the job user's (not a set-uid
    program it ran, not a process of someone else that took the pid), and it is still the job's."""
    uids = proc_uids(pid)
    if uids is None or set(uids) != {uid}:
        return False
    return is_leftover(read_environ(pid), uid, job_id, node, uid)


def kill_leftovers(pids: Iterable[int], job_id: str, node: str, uid: int, wait_s: float = 2.0) -> list[int]:
    """SIGKILL each (Slurm already sent its own signals) that is still the job's process, through a pidfd;
    returns the pids still alive after `wait_s`."""
    handles: dict[int, int] = {}
    try:
        for pid in pids:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:  # gone
                continue
            if not _still_the_jobs(pid, job_id, node, uid):
                os.close(pidfd)
                continue
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:  # exited meanwhile: the pidfd never names another process
                os.close(pidfd)
                continue
            handles[pid] = pidfd
        return _wait_exits(handles, wait_s)
    finally:
        for pidfd in handles.values():
            os.close(pidfd)


def _wait_exits(handles: dict[int, int], wait_s: float) -> list[int]:
    """Wait until every pidfd says its process exited (a zombie counts), for at most `wait_s`."""
    poller = select.poll()
    for pidfd in handles.values():
        poller.register(pidfd, select.POLLIN)
    alive = dict(handles)
    deadline = time.monotonic() + wait_s
    while alive and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(left * 1000):
            poller.unregister(fd)
            alive = {pid: pidfd for pid, pidfd in alive.items() if pidfd != fd}
    return sorted(alive)


def remove_job_cache(cache_dir: str, job_id: str, uid: int) -> str:
    """Remove `<cache_dir>/<job id>`; returns what happened: removed | absent | refused: ...

    `cache_dir` must be reached through root's directories only; the job's directory must be a real
    directory of the job's user `uid`. It is removed through descriptors, never through a path a user
    could replace (shutil.rmtree with dir_fd is safe against links inside it on Linux).
    """
    parse_job_id(job_id)
    try:
        root = open_root_dir(cache_dir)
    except FileNotFoundError:
        return "absent"
    except UnsafePath as exc:
        return f"refused: {exc}"
    except OSError as exc:
        return f"refused: {cache_dir}: {exc.strerror}"
    target = f"{cache_dir.rstrip('/')}/{job_id}"
    try:
        st = os.stat(job_id, dir_fd=root, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            return f"refused: {target} is not a directory (a symlink?)"
        if st.st_uid != uid:
            return f"refused: {target} is owned by uid {st.st_uid}, not by the job's user (uid {uid})"
        if not shutil.rmtree.avoids_symlink_attacks:
            return "refused: this platform's rmtree is not safe against symlink attacks"
        shutil.rmtree(job_id, dir_fd=root)
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"refused: {target}: {exc.strerror}"
    finally:
        os.close(root)
    return "removed"
