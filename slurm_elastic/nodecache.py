"""A data file copied once per node into shared memory, so that every worker of a job on the node maps the
same pages, and a worker that joins or restarts later maps them again instead of reading storage.

The copy lives in `<cache dir>/<job>/` (cache dir: `SLURM_ELASTIC_CACHE_DIR`, default
`/dev/shm/slurm-elastic`; job: the Slurm job of this process, else the elastic job's id), which the
admin hooks' epilog and the node's agent remove when the job leaves the node. Outside a job, without
room, or on any error, the original file is used.

Nothing there is trusted before it is checked: the cache directory must be a real directory of root's
(the hooks make it, sticky and world-writable) or of this user, that others cannot replace entries of;
the job's directory must be a real directory of this user, private to it. A copy someone else planted
under the job's name is then never mapped: the original file is read instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path

DEFAULT_CACHE_DIR = "/dev/shm/slurm-elastic"
_HEADROOM = 1.2  # leave the node's shared memory some room beyond the copy


def job_cache_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """This job's cache directory on this node, or None outside a job."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_ELASTIC_JOB_ID")
    if not job or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,100}", job) or job in (".", ".."):
        return None
    return Path(env.get("SLURM_ELASTIC_CACHE_DIR") or DEFAULT_CACHE_DIR) / job


def _key(path: Path) -> str:
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return f"{hashlib.sha256(ident.encode()).hexdigest()[:20]}-{path.name}"


def _trusted(directory: Path) -> bool:
    """Whether this job's cache directory may be used: see the module's docstring. Made here if missing."""
    me = os.geteuid()
    root = directory.parent
    root.mkdir(parents=True, exist_ok=True)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, me):
        return False
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return False
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    st = os.lstat(directory)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == me and not st.st_mode & 0o077


def node_local(path: Path, env: Mapping[str, str] | None = None) -> Path:
    """`path`'s copy in this job's node cache (made now if it is not there yet), or `path` itself."""
    directory = job_cache_dir(env)
    if directory is None:
        return path
    try:
        if not _trusted(directory):
            return path  # planted by someone else: never read or write through it
        target = directory / _key(path)
        if target.exists():
            return target
        with open(directory / ".lock", "w", opener=_no_follow) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the node's other workers wait for the one copy
            if target.exists():
                return target
            if shutil.disk_usage(directory).free < path.stat().st_size * _HEADROOM:
                return path
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            try:
                shutil.copyfile(path, tmp)
                os.replace(tmp, target)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
        return target
    except OSError:
        return path


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def remove_job_cache(env: Mapping[str, str] | None = None) -> None:
    """Remove this job's cache directory on this node (the agent calls it when it ends): only a real
    directory of this user, never through a link."""
    directory = job_cache_dir(env)
    if directory is None:
        return
    try:
        st = os.lstat(directory)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        shutil.rmtree(directory, ignore_errors=True)
