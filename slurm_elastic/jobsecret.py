"""The job's secret inside a process, and how a node agent hands it to a worker without any environment.

The agent writes the secret into a fresh pipe, closes the pipe's write end and starts the worker with the
read end open (`pass_fds`); SLURM_ELASTIC_SECRET_FD names it as DESCRIPTOR:INODE. A shell, `exec` or any
other wrapper that keeps descriptors passes it through. `import slurm_elastic` reads the secret, closes the
descriptor and removes the variable: from then on the secret is in this process's memory only, and nothing
the training code starts inherits it, neither in its environment nor as a descriptor. The pipe's inode is
checked first, so a descriptor number that a wrapper closed and reused for something else is never read or
closed. In memory the secret is a `Secret`, whose repr never shows it (tracebacks with locals, error
reporters, debuggers).
"""

from __future__ import annotations

import os
import re
import stat

from slurm_elastic.errors import ConfigError

SECRET_FD = "SLURM_ELASTIC_SECRET_FD"
MAX_BYTES = 4096  # one atomic pipe write (PIPE_BUF on Linux); a job's secret is 64 hex characters
_FD_VALUE = re.compile(r"[0-9]{1,9}:[0-9]{1,20}")


class Secret(str):
    """The job's secret: a str (HMACs, JSON) whose repr is a placeholder."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'<secret>'"


_secret = Secret("")
_problem: str | None = None  # why the hand-over failed, raised when the secret is needed


def secret_pipe(secret: str) -> tuple[int, str]:
    """For a worker about to start: the read end of a pipe that holds `secret` (its write end is closed
    already, so the reader gets the secret, then end of file) and SLURM_ELASTIC_SECRET_FD's value for it.
    The caller passes the read end to the worker and then closes its own copy."""
    data = secret.encode()
    if not 0 < len(data) <= MAX_BYTES:
        raise ConfigError(f"the job's secret is {len(data)} bytes (expected 1 to {MAX_BYTES})")
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)  # at most PIPE_BUF bytes into an empty pipe: written whole, never blocks
        value = f"{read_end}:{os.fstat(read_end).st_ino}"
    except OSError:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return read_end, value


def parse_secret_fd(raw: str) -> tuple[int, int]:
    """SLURM_ELASTIC_SECRET_FD's value: (descriptor, the pipe's inode)."""
    if not _FD_VALUE.fullmatch(raw):
        raise ConfigError(f"invalid {SECRET_FD}: {raw[:40]!r} (expected DESCRIPTOR:INODE, as the node agent sets it)")
    fd, inode = raw.split(":")
    return int(fd), int(inode)


def read_secret_fd(raw: str) -> Secret:
    """Read the secret from the pipe SLURM_ELASTIC_SECRET_FD names and close it; a descriptor that is not
    that pipe any more is left alone."""
    fd, inode = parse_secret_fd(raw)
    how = "start the training script directly, from a shell, or with exec, from the node agent"
    try:
        info = os.fstat(fd)
    except OSError:
        raise ConfigError(f"{SECRET_FD}={raw}: descriptor {fd} is not open: a wrapper closed it ({how})") from None
    if not stat.S_ISFIFO(info.st_mode) or info.st_ino != inode:
        raise ConfigError(f"{SECRET_FD}={raw}: descriptor {fd} is not the agent's pipe any more ({how})")
    data = b""
    try:
        while len(data) <= MAX_BYTES and (chunk := os.read(fd, MAX_BYTES + 1)):
            data += chunk  # never blocks: no process holds the pipe's write end
    finally:
        os.close(fd)
    if not data:
        raise ConfigError(f"{SECRET_FD}={raw}: the pipe was empty (another process that inherited it read it first)")
    if len(data) > MAX_BYTES or not data.isascii():
        raise ConfigError(f"{SECRET_FD}={raw}: the pipe does not hold a job secret (not 1 to {MAX_BYTES} ASCII bytes)")
    return Secret(data.decode())


def take_from_environment() -> None:
    """Run at `import slurm_elastic`: take the secret the node agent handed over out of its pipe and the
    variable out of os.environ, before the training code can start anything. A failure is kept, and raised
    by `handed_over()` when a worker needs the secret (importing the package never fails)."""
    global _secret, _problem
    raw = os.environ.pop(SECRET_FD, None)
    if raw is None:
        return
    try:
        _secret, _problem = read_secret_fd(raw), None
    except ConfigError as exc:
        _secret, _problem = Secret(""), str(exc)


def handed_over() -> Secret:
    """The secret this process's node agent handed over; empty when none was; ConfigError when it failed."""
    if _problem is not None:
        raise ConfigError(_problem)
    return _secret
