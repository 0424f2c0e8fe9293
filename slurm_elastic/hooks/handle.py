"""Read a job's coordinator.json as root without trusting the job's user.

The path comes from the job's comment, which the user controls. Before root reads it: no symlink as the
last component (O_NOFOLLOW), a regular file (O_NONBLOCK, so a FIFO cannot hang the hook), owned by the
job's user, readable by its owner only (as the launcher writes it), and small. Root therefore reads only
what the job's user could read and has kept private, and never a file of someone else.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import PurePosixPath

from slurm_elastic.hooks.hookenv import HookInputError
from slurm_elastic.jobdir import JobHandle

__all__ = ["MAX_HANDLE_BYTES", "HandleMissing", "check_handle_stat", "parse_handle", "read_handle"]

MAX_HANDLE_BYTES = 64 * 1024
_ADDRESS = re.compile(r"[A-Za-z0-9_.\-]{1,253}:[0-9]{1,5}|\[[0-9A-Fa-f:.]{2,45}\]:[0-9]{1,5}")
_JOB_ID = re.compile(r"[A-Za-z0-9_.\-]{1,100}")


class HandleMissing(HookInputError):
    """No handle at the path: the launcher removes it when the job's coordinator ends."""


def check_handle_stat(mode: int, owner: int, size: int, uid: int, path: str = "coordinator.json") -> None:
    """Raise HookInputError unless the file may be read on behalf of the user `uid`."""
    if not stat.S_ISREG(mode):
        raise HookInputError(f"{path!r} is not a regular file")
    if owner != uid:
        raise HookInputError(f"{path!r} is owned by uid {owner}, not by the job's user (uid {uid})")
    if mode & 0o077:
        raise HookInputError(f"{path!r} has mode {stat.filemode(mode)}; it must be private to its owner (0600)")
    if size > MAX_HANDLE_BYTES:
        raise HookInputError(f"{path!r} is {size} bytes; a job handle is at most {MAX_HANDLE_BYTES}")


def parse_handle(data: bytes, path: str = "coordinator.json") -> JobHandle:
    """Validate a handle's JSON; unknown keys are ignored (a newer launcher may add some)."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise HookInputError(f"{path!r} is not JSON") from None
    if not isinstance(raw, dict):
        raise HookInputError(f"{path!r} is not a JSON object")
    job_id, address, secret = raw.get("job_id"), raw.get("address"), raw.get("secret")
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise HookInputError(f"{path!r}: job_id {str(job_id)[:100]!r} is not a job id")
    if (
        not isinstance(address, str)
        or not _ADDRESS.fullmatch(address)
        or not 0 < int(address.rpartition(":")[2]) < 65536
    ):
        raise HookInputError(f"{path!r}: address {str(address)[:100]!r} is not HOST:PORT")
    if not isinstance(secret, str) or not 16 <= len(secret) <= 512:
        raise HookInputError(f"{path!r}: the secret is missing or has the wrong length")  # never quote it
    host, pid, started = raw.get("host", ""), raw.get("pid", 0), raw.get("started", 0.0)
    if not isinstance(host, str) or not isinstance(pid, int) or not isinstance(started, int | float):
        raise HookInputError(f"{path!r}: host, pid or started has the wrong type")
    return JobHandle(job_id, address, secret, host[:255], pid, float(started))


def read_handle(path: PurePosixPath, uid: int) -> JobHandle:
    """Open, check and parse the handle at `path` for the job's user `uid`."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise HandleMissing(f"{str(path)!r} does not exist (the coordinator has ended)") from None
    except OSError as exc:
        why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise HookInputError(f"cannot open {str(path)!r}: {why}") from None
    try:
        st = os.fstat(fd)
        check_handle_stat(st.st_mode, st.st_uid, st.st_size, uid, str(path))
        data = os.read(fd, MAX_HANDLE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_HANDLE_BYTES:
        raise HookInputError(f"{str(path)!r} grew past {MAX_HANDLE_BYTES} bytes while being read")
    return parse_handle(data, str(path))
