"""Files in a checkpoint directory, which the user chose and others may be able to write to (a team's
shared directory, a copied checkpoint).

Writing: every directory this code creates is made 0700 and every file 0600, whatever the umask; a file is
written to a fresh random name opened with O_CREAT|O_EXCL|O_NOFOLLOW and renamed into place, so a link
planted at a predictable name is never written through. A directory the user gave us is used as it is.

Reading: below the directory the user gave us, no symbolic link is followed (each step is opened relative to
its parent with O_NOFOLLOW); only regular files are read (a FIFO or a device would block or never end), and
small files are read up to a limit.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from slurm_elastic.errors import ElasticError

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class CheckpointError(ElasticError):
    """A checkpoint could not be written or read."""


def _refuse(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"refusing checkpoint path {path}: {why}")


def _tighten(path: Path) -> None:
    """`path`, a directory this code just made: check it is still ours and make it 0700 (mkdir's mode is
    masked by the umask)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refuse(path, "it is a symbolic link or not a directory") from None
        raise
    try:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():
            raise _refuse(path, f"it is owned by uid {owner}, not by you (uid {os.geteuid()})")
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """`path` and any missing parents, each one this code creates 0700; what exists is left as it is."""
    missing: list[Path] = []
    at = path
    while not os.path.lexists(at):
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue  # another rank made it meanwhile
        _tighten(directory)
    if not path.is_dir():
        raise _refuse(path, "it is not a directory")


def own_dir(parent: Path, name: str) -> Path:
    """`parent/name`, a directory of this code's (a step's): made 0700, or the one there checked to be a real
    directory (never a symbolic link) that is ours, and tightened to 0700."""
    path = parent / name
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse(path, "it is a symbolic link or not a directory") from None
    _tighten(path)
    return path


def fresh_dir(parent: Path, name: str) -> Path:
    """A new empty directory `parent/.name.<random>.tmp`, 0700: only this process writes into it."""
    path = parent / f".{name}.{secrets.token_hex(8)}.tmp"
    os.mkdir(path, 0o700)  # fails if anything, a link included, is there
    _tighten(path)
    return path


def write_file(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write `path` (0600) through a fresh temporary name, fsync and an atomic rename."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _regular(fd: int, path: Path, limit: int | None) -> int:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _refuse(path, "it is not a regular file")
    if limit is not None and st.st_size > limit:
        os.close(fd)
        raise _refuse(path, f"it is {st.st_size} bytes; the limit is {limit}")
    return fd


def open_file(path: Path, *, follow: bool, limit: int | None = None) -> BinaryIO:
    """A regular file, opened without following a link at its own name unless `follow` (a path the user named);
    FileNotFoundError if absent."""
    try:
        fd = os.open(path, _READ | (0 if follow else os.O_NOFOLLOW))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, "it is a symbolic link") from None
        raise
    return os.fdopen(_regular(fd, path, limit), "rb")


def _check_part(part: str, root: Path) -> None:
    if not part or part in (".", "..") or "/" in part or "\0" in part:
        raise _refuse(root / part, f"{part!r} is not a plain name")


def open_beneath(root: Path, parts: Sequence[str], limit: int | None = None) -> BinaryIO:
    """`root/parts...` opened one name at a time, none of them followed if it is a link: a link planted for a
    step or rank directory, or a file, cannot lead the read out of `root` (which is the user's, and followed)."""
    for part in parts:
        _check_part(part, root)
    path = root.joinpath(*parts)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = (_READ if last else os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) | os.O_NOFOLLOW
            try:
                child = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refuse(root.joinpath(*parts[: i + 1]), "a symbolic link or not a directory") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(_regular(fd, path, limit), "rb")


def read_beneath(root: Path, parts: Sequence[str], limit: int) -> bytes:
    with open_beneath(root, parts, limit) as fh:
        return fh.read(limit + 1)


__all__ = [
    "CheckpointError", "fresh_dir", "make_dirs", "open_beneath", "open_file", "own_dir", "read_beneath", "write_file",
]  # fmt: skip
