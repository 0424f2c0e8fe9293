"""Where a job's files live, and the handle (address and secret) that lets tools reach its coordinator.

`$SLURM_ELASTIC_HOME/jobs/<user>/<job id>/` (default home: ~/.slurm-elastic, on the shared file system
of a cluster) holds `coordinator.json` (it carries the job's secret), `launch.json` (the command
satellites run), `events.jsonl`, the agents' exit codes, checkpoints and, when asked for, the sample ledger.

The home may be shared with other users, so nothing here trusts a path. Job ids are predictable (Slurm's
next number, a local id's time and pid), so they live in a directory of the user's own, `jobs/<user>/`:
no one else can create a name in it. That directory and the job's are used only when each is a real
directory (not a symbolic link) owned by this user, and are made owner-only (0700); `jobs/` must not let
others replace them. Files are written to a fresh temporary name opened with O_CREAT|O_EXCL|O_NOFOLLOW (a
name planted by someone else is never written through) and renamed into place, mode 0600; readers open
them with O_NOFOLLOW and check their owner and mode.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import secrets
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurm_elastic.agentspec import LEASE_TIMEOUT_S
from slurm_elastic.errors import ElasticError
from slurm_elastic.jobsecret import Secret

HANDLE = "coordinator.json"
MAX_FILE_BYTES = 16 * 1024 * 1024


def home() -> Path:
    return Path(os.environ.get("SLURM_ELASTIC_HOME") or Path.home() / ".slurm-elastic")


def user_name() -> str:
    """This process's user: the per-user level of the home (`uid-<N>` for a uid without a name)."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid-{uid}"


def plain_name(what: str, value: str) -> str:
    if not value or value in (".", "..") or "/" in value or "\0" in value:
        raise ElasticError(f"{what} {value!r} cannot name a directory: expected one name, without '/', not '.' or '..'")
    return value


def user_jobs(root: Path | None = None, user: str | None = None) -> Path:
    """`<home>/jobs/<user>/`: one user's job directories (default user: this process's)."""
    return (root or home()) / "jobs" / plain_name("user name", user or user_name())


def job_dir(job_id: str, root: Path | None = None, user: str | None = None) -> Path:
    """`<home>/jobs/<user>/<job id>/`: a path only; `make_job_dir` creates it, `find_job` reads it."""
    return user_jobs(root, user) / plain_name("job id", job_id)


def home_of(directory: Path) -> Path:
    """The home that a job directory (`<home>/jobs/<user>/<job id>`) lies in."""
    return directory.parents[2]


@dataclass(frozen=True)
class JobHandle:
    job_id: str
    address: str
    secret: str = field(repr=False)
    host: str
    pid: int
    started: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "secret", Secret(self.secret))  # a repr that hides it, wherever it goes next

    def write(self, directory: Path) -> Path:
        return write_private(directory, HANDLE, json.dumps(asdict(self)).encode())

    @classmethod
    def read(cls, directory: Path) -> JobHandle:
        path = directory / HANDLE
        try:
            return cls(**json.loads(read_private(path)))
        except FileNotFoundError:
            raise ElasticError(f"no running job found at {directory} (missing {HANDLE})") from None
        except (ValueError, TypeError) as exc:
            raise ElasticError(f"{path} is not a valid job handle: {exc}") from None


def find_job(job_id: str, root: Path | None = None, user: str | None = None) -> JobHandle:
    """The handle of `user`'s job `job_id` (default: this process's user). Its directories must be real
    directories of that user that no one else may write to; the handle must name the job asked for."""
    directory = job_dir(job_id, root, user)
    if not check_job_dir(directory, user):
        base = directory.parent
        known = sorted(p.name for p in base.iterdir())[-10:] if base.is_dir() else []
        hint = f"; known jobs: {', '.join(known)}" if known else ""
        legacy = (root or home()) / "jobs" / job_id
        if os.path.lexists(legacy):
            hint += f"; {legacy} is where versions before per-user job directories kept a job: use that version"
        raise ElasticError(f"no job {job_id!r} under {base}{hint}")
    handle = JobHandle.read(directory)
    if handle.job_id != job_id:
        raise ElasticError(f"{directory / HANDLE} is the handle of job {handle.job_id!r}, not of {job_id!r}")
    return handle


def new_local_job_id() -> str:
    return f"local-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


LAUNCH = "launch.json"


@dataclass(frozen=True)
class LaunchInfo:
    """How to start one more node of a running job (read by satellite agents)."""

    command: list[str]
    nproc_per_node: int
    max_restarts: int
    drain_grace_s: float
    heartbeat_interval_s: float
    worker_env: dict[str, str]
    lease_timeout_s: float = LEASE_TIMEOUT_S
    launcher: str = "slurm"  # "local": `slurm-elastic run --local` (grow and reclaim start and stop local agents)
    cwd: str | None = None  # where the training command runs (a local job's working directory)

    def write(self, directory: Path) -> Path:
        return write_private(directory, LAUNCH, json.dumps(asdict(self)).encode())

    @classmethod
    def read(cls, directory: Path) -> LaunchInfo:
        try:
            return cls(**json.loads(read_private(directory / LAUNCH)))
        except FileNotFoundError:
            raise ElasticError(f"no running job found at {directory} (missing {LAUNCH})") from None
        except (ValueError, TypeError) as exc:
            raise ElasticError(f"{directory / LAUNCH} is not valid: {exc}") from None


def hook_comment(directory: Path) -> str:
    """The Slurm job comment that lets the admin hooks find the job's coordinator."""
    return f"slurm-elastic:{(directory / HANDLE).resolve()}"


# --- private directories and files ------------------------------------------------------------------------


SQUATTED = "someone else made it: have it removed, or set SLURM_ELASTIC_HOME to a directory of your own"


def _refuse(path: Path, why: str) -> ElasticError:
    return ElasticError(f"refusing to use {path}: {why}")


def _uid(uid: int) -> str:
    """`uid 1000 (alice)`, or `uid 1000` for a uid without a name."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _owner(path: Path) -> str:
    try:
        return _uid(os.lstat(path).st_uid)
    except OSError:
        return "an owner unknown (it is gone)"


def _check_parent(parent: Path) -> None:
    """Others must not be able to replace or rename what is in `parent` (the home's `jobs/`)."""
    st = os.stat(parent)
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise _refuse(parent, f"it is owned by {_uid(st.st_uid)}, not by you ({_uid(me)}) or root; {SQUATTED}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise _refuse(parent, f"others may write to it ({stat.filemode(st.st_mode)}) and it is not sticky")


def private_dir(directory: Path) -> Path:
    """Create `directory` owner-only, or check the one there: a real directory (never a symbolic link)
    owned by this user, whose parent others cannot write to (unless sticky). A looser mode is tightened
    to 0700. Raises ElasticError naming the path, its owner and what to do."""
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file or a dangling link in the way
        raise _refuse(directory.parent, f"it cannot be made a directory ({exc.strerror})") from None
    _check_parent(directory.parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise _refuse(directory, str(exc.strerror)) from None
        why = f"it is a symbolic link or not a directory, owned by {_owner(directory)}"
        raise _refuse(directory, f"{why}; {SQUATTED}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            mine = _uid(os.geteuid())
            raise _refuse(directory, f"it is owned by {_uid(st.st_uid)}, not by you ({mine}); {SQUATTED}")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return directory


def make_job_dir(directory: Path) -> Path:
    """Create, or check, a job's directory `<home>/jobs/<user>/<job id>` and the user's directory above it,
    both owner-only: a name another user made first is refused (ElasticError), and nothing is written."""
    private_dir(directory.parent)
    return private_dir(directory)


def check_job_dir(directory: Path, user: str | None = None) -> bool:
    """For readers: False if `directory` is absent; True if it and the user's directory above it are real
    directories of `user` (default: this process's) that no one else may write to; else ElasticError."""
    uid = os.geteuid() if user is None else _uid_of(user)
    for path in (directory.parent, directory):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise _refuse(path, str(exc.strerror)) from None
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse(path, f"it is a symbolic link or not a directory, owned by {_uid(st.st_uid)}")
        if st.st_uid != uid:
            raise _refuse(path, f"it is owned by {_uid(st.st_uid)}, not by its user ({_uid(uid)})")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise _refuse(path, f"others may write to it ({stat.filemode(st.st_mode)})")
    return True


def _uid_of(user: str) -> int:
    if user.startswith("uid-") and user[4:].isdigit():
        return int(user[4:])
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ElasticError(f"no user named {user!r} on this machine") from None


def write_private(directory: Path, name: str, data: bytes) -> Path:
    """Write `directory/name` (mode 0600) through a fresh temporary name and an atomic rename."""
    private_dir(directory)
    path = directory / name
    tmp = directory / f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def check_private_stat(path: Path, st: os.stat_result, uid: int) -> None:
    """A file read for a secret or a command: a regular file of `uid` (root may read anyone's), owner-only."""
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, "it is not a regular file")
    if st.st_uid != uid and uid != 0:
        raise _refuse(path, f"it is owned by uid {st.st_uid}, not by you (uid {uid})")
    if st.st_mode & 0o077:
        raise _refuse(path, f"its mode is {stat.filemode(st.st_mode)}; it must be private to its owner (0600)")
    if st.st_size > MAX_FILE_BYTES:
        raise _refuse(path, f"it is {st.st_size} bytes; the limit is {MAX_FILE_BYTES}")


def read_private(path: Path) -> bytes:
    """Read a file written by `write_private`, without following a link; FileNotFoundError if absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, "it is a symbolic link") from None
        if isinstance(exc, FileNotFoundError):
            raise
        raise _refuse(path, str(exc.strerror)) from None
    with os.fdopen(fd, "rb") as fh:
        check_private_stat(path, os.fstat(fh.fileno()), os.geteuid())
        return fh.read(MAX_FILE_BYTES + 1)
