"""What the Epilog leaves clean on a node that a job left: the job's data cache directory, and any
process of the job that escaped Slurm's process tracking (a worker that daemonised itself).

A process is the job's when it runs as the job's user and its environment says SLURM_JOB_ID=<job>,
SLURMD_NODENAME=<this node> and holds a SLURM_ELASTIC_* variable: the node name matters where several
slurmds share one machine (the local test cluster), so that a shrink never kills the job elsewhere.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from slurm_elastic.hooks.hookenv import parse_job_id

__all__ = ["find_leftovers", "is_leftover", "kill_leftovers", "read_environ", "remove_job_cache"]

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


def kill_leftovers(pids: Iterable[int], wait_s: float = 2.0) -> list[int]:
    """SIGKILL each (Slurm already sent its own signals); returns the pids still alive after `wait_s`."""
    pids = list(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
    deadline = time.monotonic() + wait_s
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in alive if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
    return alive


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def remove_job_cache(cache_dir: str, job_id: str) -> str:
    """Remove `<cache_dir>/<job id>`; returns what happened: removed | absent | refused: ...

    The directory is the job user's: it must be a real directory, not a symlink planted to make root
    delete something else, and shutil.rmtree is safe against symlinks inside it on Linux.
    """
    parse_job_id(job_id)
    target = Path(cache_dir) / job_id
    try:
        st = target.lstat()
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"refused: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return "refused: not a directory (a symlink?)"
    if not shutil.rmtree.avoids_symlink_attacks:
        return "refused: this platform's rmtree is not safe against symlink attacks"
    try:
        shutil.rmtree(target)
    except OSError as exc:
        return f"refused: {exc.strerror}"
    return "removed"
