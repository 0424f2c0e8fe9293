"""Paths that root may act in without a user's link or directory steering it somewhere else.

The hooks run as root; a cache directory such as /dev/shm/slurm-elastic lives in a directory every user
may write to. `open_root_dir` walks a path from / with a file descriptor per step (never a path string
the kernel resolves again later): every directory on the way must be root's and not writable by others
unless sticky, and a symbolic link is followed only when root owns it. What root then does (chmod, a probe
file, removing a job's directory) goes through that descriptor. `check_root_tree` is the same judgement
for what root executes: an interpreter and the directories it imports from.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

from slurm_elastic.errors import ElasticError

__all__ = ["UnsafePath", "check_root_file", "check_root_tree", "open_root_dir", "unsafe_for_root"]

_MAX_LINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(ElasticError):
    """A path root must not act in or run from: someone other than root controls part of it."""


def unsafe_for_root(st: os.stat_result, *, directory: bool) -> str | None:
    """Why root must not trust this entry, or None: owned by root, and not writable by group or others
    (a directory may be, when sticky: then no one can replace what others put in it)."""
    if st.st_uid != 0:
        return f"owned by uid {st.st_uid}, not root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (directory and st.st_mode & stat.S_ISVTX):
        return f"writable by group or others ({stat.filemode(st.st_mode)})"
    return None


def _join(where: str, name: str) -> str:
    return f"{where.rstrip('/')}/{name}"


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def open_root_dir(path: str, *, create_mode: int | None = None) -> int:
    """A descriptor of directory `path`, reached from / through root's directories only.

    With `create_mode`, missing directories are created: the last one with that mode (applied with
    fchmod, so the umask does not narrow it), the ones before it 0755. Raises UnsafePath naming the first
    entry that is not root's (or is writable by others, or is a link of another user); raises
    FileNotFoundError when a directory is missing and none may be created, NotADirectoryError when a
    file of root's is in the way (a mistake of the admin's, not a user's plant).
    """
    if not path.startswith("/"):
        raise UnsafePath(f"{path!r} is not an absolute path")
    fd, where, todo, links = _open_slash(), "/", _parts(path), 0
    try:
        while todo:
            name = todo.pop(0)
            if name == "..":
                os.close(fd)
                where = os.path.dirname(where.rstrip("/")) or "/"
                fd = open_root_dir(where)
                continue
            here = _join(where, name)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if create_mode is None:
                    raise
                with contextlib.suppress(FileExistsError):  # then someone else's: judged below
                    os.mkdir(name, 0o700, dir_fd=fd)  # no one else may enter it before it is checked
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if todo and st.st_uid == 0 and stat.S_ISDIR(st.st_mode):
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                    os.fchmod(sub, 0o755)
                    os.close(sub)
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid != 0:
                    raise UnsafePath(f"{here} is a symbolic link of uid {st.st_uid}, not root's")
                links += 1
                if links > _MAX_LINKS:
                    raise UnsafePath(f"{path!r} has more than {_MAX_LINKS} symbolic links")
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd, where = _open_slash(), "/"
                todo = _parts(target) + todo
                continue
            if not stat.S_ISDIR(st.st_mode):
                if st.st_uid != 0:  # planted by a user: never a reason to act (or to drain a node)
                    raise UnsafePath(f"{here} is not a directory, and belongs to uid {st.st_uid}")
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", here)
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd, where = sub, here
            why = unsafe_for_root(os.fstat(fd), directory=True)
            if why is not None:
                raise UnsafePath(f"{where} is {why}")
        if create_mode is not None and stat.S_IMODE(os.fstat(fd).st_mode) != create_mode:
            os.fchmod(fd, create_mode)  # root's, reached without a link of anyone else: safe to change
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_slash() -> int:
    fd = os.open("/", _DIR_FLAGS)
    why = unsafe_for_root(os.fstat(fd), directory=True)
    if why is not None:
        os.close(fd)
        raise UnsafePath(f"/ is {why}")
    return fd


def check_root_file(path: str) -> str | None:
    """Why root must not execute `path`, or None: the file (after root's own links) and every directory
    above it are root's and not writable by others."""
    where, name = os.path.split(os.path.normpath(path))
    for _ in range(_MAX_LINKS):
        try:
            fd = open_root_dir(where or "/")
        except (UnsafePath, OSError) as exc:
            return str(exc) if isinstance(exc, UnsafePath) else f"{where}: {exc.strerror}"
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid != 0:
                    return f"{_join(where, name)} is a symbolic link of uid {st.st_uid}, not root's"
                target = os.readlink(name, dir_fd=fd)
                where, name = os.path.split(os.path.normpath(os.path.join(where, target)))
                continue
        except OSError as exc:
            return f"{_join(where, name)}: {exc.strerror}"
        finally:
            os.close(fd)
        why = unsafe_for_root(st, directory=False)
        return f"{_join(where, name)} is {why}" if why else None
    return f"{path} has more than {_MAX_LINKS} symbolic links"


def check_root_tree(path: str, limit: int = 5) -> list[str]:
    """Up to `limit` reasons why root must not import from directory `path`: the path to it, or any entry
    in it (links are judged themselves, never followed), is not root's or is writable by others."""
    try:
        os.close(open_root_dir(path))
    except FileNotFoundError:
        return []
    except (UnsafePath, OSError) as exc:
        return [str(exc) if isinstance(exc, UnsafePath) else f"{path}: {exc.strerror}"]
    found = []
    for entry, st in _walk(path):
        if stat.S_ISSOCK(st.st_mode):
            continue  # a socket cannot be opened, so never imported (a dev cluster's spool in a source tree)
        if stat.S_ISLNK(st.st_mode):  # a link's own mode means nothing; who may replace it does
            why = None if st.st_uid == 0 else f"a symbolic link of uid {st.st_uid}, not root's"
        else:
            why = unsafe_for_root(st, directory=stat.S_ISDIR(st.st_mode))
        if why is not None:
            found.append(f"{entry} is {why}")
            if len(found) >= limit:
                break
    return found


def _walk(top: str) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under `top` with its own lstat, depth first; links are never entered."""
    stack = [top]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    yield entry.path, st
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
